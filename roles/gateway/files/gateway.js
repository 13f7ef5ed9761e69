// sparkserve's gateway, in nginx's JavaScript module (njs): the key, the model and the route of each
// request. nginx does the rest (listening, TLS, rate limits, proxying without buffering, the 503 of an
// engine that does not answer). routes.js, rendered beside this file, holds the models, the deployments
// and the keys by SHA-256. A key is never logged: the access log carries the key's name ($gateway_key_name).
import routes from 'routes.js';
import crypto from 'crypto';

function fail(r, status, type, code, message) {
    r.headersOut['Content-Type'] = 'application/json';
    r.return(status, JSON.stringify({error: {message: message, type: type, param: null, code: code}}));
}

// The request's API key: Authorization: Bearer KEY (what OpenAI clients send), or api-key: KEY.
function presented(r) {
    var header = r.headersIn.Authorization || '';
    var match = /^Bearer\s+(\S+)\s*$/i.exec(header);
    if (match) {
        return match[1];
    }
    return r.headersIn['api-key'] || '';
}

function keyOf(r) {
    var token = presented(r);
    if (!token) {
        return null;
    }
    return routes.keys[crypto.createHash('sha256').update(token).digest('hex')] || null;
}

// js_set $gateway_key_name: the key's name, empty without a valid key (nothing is rate-limited then).
function keyName(r) {
    var key = keyOf(r);
    return key ? key.name : '';
}

// The caller's key, or null after answering 401. With no key set the gateway is open (on loopback only).
function authorize(r) {
    if (routes.open) {
        return {name: '', models: null};
    }
    var key = keyOf(r);
    if (!key) {
        fail(r, 401, 'invalid_request_error', 'invalid_api_key', presented(r)
            ? 'the API key is not valid for this gateway'
            : 'no API key; send one as Authorization: Bearer KEY');
    }
    return key;
}

function allowed(key, model) {
    return key.models === null || key.models.indexOf(model) >= 0;
}

function modelsOf(key) {
    return Object.keys(routes.models).filter(function (model) { return allowed(key, model); }).sort();
}

// POST /v1/chat/completions, /v1/completions, /v1/embeddings: to the deployment serving the body's model.
function route(r) {
    var key = authorize(r);
    if (!key) {
        return;
    }
    if (r.method !== 'POST') {
        fail(r, 405, 'invalid_request_error', 'method_not_allowed', r.uri + ' takes POST');
        return;
    }
    var body;
    try {
        body = JSON.parse(r.requestText || '');
    } catch (e) {
        fail(r, 400, 'invalid_request_error', 'invalid_json', 'the request body is not JSON');
        return;
    }
    var model = body !== null && typeof body === 'object' ? body.model : undefined;
    if (typeof model !== 'string' || model === '') {
        fail(r, 400, 'invalid_request_error', 'model_missing', 'the request body names no model');
        return;
    }
    var deployment = routes.models[model];
    if (deployment === undefined) {
        var served = modelsOf(key);
        fail(r, 404, 'invalid_request_error', 'model_not_found', 'the model ' + JSON.stringify(model)
            + ' does not exist here; served: ' + (served.length ? served.join(', ') : 'none'));
        return;
    }
    r.variables.gateway_model = model;
    if (!allowed(key, model)) {
        fail(r, 403, 'invalid_request_error', 'model_not_allowed', 'key ' + key.name + ' may not use model '
            + model + '; it may use: ' + (modelsOf(key).join(', ') || 'none'));
        return;
    }
    r.internalRedirect('@deployment_' + deployment);
}

// GET /v1/models: the models the key may use whose deployment answers now.
function models(r) {
    var key = authorize(r);
    if (!key) {
        return;
    }
    var names = modelsOf(key);
    var wanted = [];
    names.forEach(function (model) {
        if (wanted.indexOf(routes.models[model]) < 0) {
            wanted.push(routes.models[model]);
        }
    });
    // Each deployment's own entries (vLLM's carry max_model_len), or null where it does not answer.
    Promise.all(wanted.map(function (deployment) {
        return r.subrequest('/_models/' + deployment, {method: 'GET'})
            .then(function (reply) {
                if (reply.status !== 200) {
                    r.warn('gateway: deployment ' + routes.deployments[deployment] + ' answered GET /v1/models with '
                           + reply.status + '; its models are left out');
                    return null;
                }
                try {
                    return JSON.parse(reply.responseText).data || [];
                } catch (e) {
                    r.warn('gateway: deployment ' + routes.deployments[deployment] + ' answered GET /v1/models with '
                           + 'no JSON list: ' + e);
                    return [];
                }
            }, function (e) {
                r.warn('gateway: GET /v1/models of deployment ' + routes.deployments[deployment] + ' failed: ' + e);
                return null;
            });
    })).then(function (answers) {
        var listed = {};
        wanted.forEach(function (deployment, index) { listed[deployment] = answers[index]; });
        var data = names.filter(function (model) { return listed[routes.models[model]] !== null; })
            .map(function (model) {
                var own = listed[routes.models[model]].filter(function (entry) { return entry && entry.id === model; });
                return own.length ? own[0] : {id: model, object: 'model', owned_by: 'sparkserve'};
            });
        r.headersOut['Content-Type'] = 'application/json';
        r.return(200, JSON.stringify({object: 'list', data: data}));
    });
}

// Any other path: 401 without a key (nothing is told to a caller without one), else 404.
function notFound(r) {
    if (authorize(r)) {
        fail(r, 404, 'invalid_request_error', 'not_found', r.uri + ' is not a route of this gateway; it serves '
            + 'POST /v1/chat/completions, /v1/completions, /v1/embeddings and GET /v1/models');
    }
}

export default {keyName, route, models, notFound};
