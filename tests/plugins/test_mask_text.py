"""The mask_text filter: what a diagnostic archive holds of a collected text, with every secret masked."""

from __future__ import annotations

import json

import pytest
import yaml

from ansible_collections.sparkserve.deploy.plugins.filter import mask_text as mt

MASK = "********"
mask = mt.FilterModule().filters()["mask_text"]


def test_a_literal_secret_is_masked_wherever_it_appears() -> None:
    text = "token from the vault: s3cr3t-Vault.token\nagain s3cr3t-Vault.token, and s3cr3t-Vault.token!"
    assert mask(text, ["s3cr3t-Vault.token"]) == f"token from the vault: {MASK}\nagain {MASK}, and {MASK}!"


def test_the_longest_literal_is_masked_first_and_empty_ones_are_ignored() -> None:
    # An empty value (no HF_TOKEN set) must not mask between every character.
    assert mask("abcdef and abc", ["abc", "abcdef", "", None]) == f"{MASK} and {MASK}"
    assert mask("plain text", ["", None]) == "plain text"


def test_a_literal_is_masked_as_escaped_inside_json_text() -> None:
    secret = 'quo"te\\back'
    text = "log line: " + json.dumps({"value": secret})
    assert secret.replace('"', '\\"') not in mask(text, [secret])
    assert mask(text, [secret]) == 'log line: {"value": "%s"}' % MASK


@pytest.mark.parametrize("token", ["hf_abcdefghij", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"])
def test_hugging_face_tokens_are_masked_without_being_named(token: str) -> None:
    assert mask(f"downloading with {token} from the hub") == f"downloading with {MASK} from the hub"


def test_short_hf_words_are_kept() -> None:
    assert mask("hf_transfer is on; see hf_hub_cache") == "hf_transfer is on; see hf_hub_cache"


def test_env_lines_of_secret_looking_names_are_masked_to_the_end_of_the_line() -> None:
    text = ("HF_TOKEN=abc def\n"
            "export OPENAI_API_KEY='sk-1'\n"
            "  DB_PASSWORD = hunter2\n"
            "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1\n"
            "NCCL_IB_PKEY=3\n"
            "TOKENIZERS_PARALLELISM=false\n"
            "VLLM_MAX_TOKENS=4\n")
    assert mask(text) == (f"HF_TOKEN={MASK}\n"
                          f"export OPENAI_API_KEY={MASK}\n"
                          f"  DB_PASSWORD = {MASK}\n"
                          "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1\n"
                          "NCCL_IB_PKEY=3\n"
                          "TOKENIZERS_PARALLELISM=false\n"
                          "VLLM_MAX_TOKENS=4\n")


def test_assignments_inside_a_line_are_masked() -> None:
    # systemd's Environment= line, docker's -e, a Python repr (vLLM logs its non-default args so).
    assert mask("Environment=HF_TOKEN=abc NCCL_DEBUG=INFO") == f"Environment=HF_TOKEN={MASK} NCCL_DEBUG=INFO"
    assert mask("docker run -e HF_TOKEN=abc -e X=1 img") == f"docker run -e HF_TOKEN={MASK} -e X=1 img"
    assert mask("INFO non-default args: {'model': '/m', 'api_key': ['sk-1'], 'max_tokens': 5}") == (
        f"INFO non-default args: {{'model': '/m', 'api_key': [{MASK}], 'max_tokens': 5}}")
    assert mask('config {"hf_token": "abc", "port": 8000}') == f'config {{"hf_token": "{MASK}", "port": 8000}}'


@pytest.mark.parametrize("line,want", [
    ("vllm serve /m --api-key sk-1 --port 8000", f"vllm serve /m --api-key {MASK} --port 8000"),
    ("vllm serve /m --api-key=sk-1 --port 8000", f"vllm serve /m --api-key={MASK} --port 8000"),
    ("vllm serve /m --api_key 'sk 1' --port 8000", f"vllm serve /m --api_key '{MASK}' --port 8000"),
    ('argv ["serve", "--api-key", "sk-1", "--port", "1"]', f'argv ["serve", "--api-key", "{MASK}", "--port", "1"]'),
    ("--hf-token --api-key sk-1", f"--hf-token --api-key {MASK}"),
    ("--ssl-keyfile /etc/key.pem --max-num-batched-tokens 8192",) * 2,
])
def test_the_value_of_a_secret_looking_flag_is_masked(line: str, want: str) -> None:
    assert mask(line) == want


@pytest.mark.parametrize("line,want", [
    ("GET /v1/models Authorization: Bearer eyJhbGciOi.abc-def", f"GET /v1/models Authorization: {MASK}"),
    ('curl -H "Authorization: Basic dXNlcjpwYXNz" http://h', f'curl -H "Authorization: {MASK}" http://h'),
    ("sent bearer abc.def_ghi~jkl to the API", f"sent bearer {MASK} to the API"),
    ("pull https://user:p4ss@registry.example/v2/ and http://h:8000/v1",
     f"pull https://user:{MASK}@registry.example/v2/ and http://h:8000/v1"),
])
def test_bearer_tokens_authorization_headers_and_url_passwords_are_masked(line: str, want: str) -> None:
    assert mask(line) == want


def test_docker_inspect_json_masks_the_env_list_and_the_command_line() -> None:
    inspect = [{
        "Id": "f00d",
        "Args": ["serve", "/models/m", "--api-key", "sk-arg", "--port", "8000"],
        "Config": {
            "Env": ["HF_TOKEN=hf_x", "HUGGING_FACE_HUB_TOKEN=y", "NCCL_IB_HCA=rocep1s0f1", "PATH=/usr/bin",
                    "MY_LITERAL=the-vault-value", "OPENAI_API_KEY=a=b"],
            "Cmd": ["vllm", "serve", "--api-key=sk-cmd"],
            "Labels": {"sparkserve.deployment": "d", "sparkserve.fingerprint": "ab" * 32},
            "Healthcheck": {"Test": ["CMD", "curl", "-H", "Authorization: Bearer tok"]},
        },
        "HostConfig": {"Memory": 118111600640, "Secret": {"nested": ["x", 1]}},
    }]
    text = json.dumps(inspect, indent=4) + "\n"
    out = mask(text, ["the-vault-value"])
    assert out.endswith("]\n")
    got = json.loads(out)[0]
    assert got["Config"]["Env"] == [f"HF_TOKEN={MASK}", f"HUGGING_FACE_HUB_TOKEN={MASK}", "NCCL_IB_HCA=rocep1s0f1",
                                    "PATH=/usr/bin", f"MY_LITERAL={MASK}", f"OPENAI_API_KEY={MASK}"]
    assert got["Args"] == ["serve", "/models/m", "--api-key", MASK, "--port", "8000"]
    assert got["Config"]["Cmd"] == ["vllm", "serve", f"--api-key={MASK}"]
    assert got["Config"]["Labels"] == inspect[0]["Config"]["Labels"]
    assert got["Config"]["Healthcheck"]["Test"] == ["CMD", "curl", "-H", f"Authorization: {MASK}"]
    # Under a secret-looking key every string goes; numbers stay.
    assert got["HostConfig"] == {"Memory": 118111600640, "Secret": {"nested": [MASK, 1]}}
    for secret in ("hf_x", "=y", "sk-arg", "sk-cmd", "the-vault-value", "a=b", "tok"):
        assert secret not in out, secret


def test_a_recorded_render_keeps_its_numbers_and_settings() -> None:
    render = {"recipe": {"expect": {"eos_token_id": 154828}, "env": {"NCCL_DEBUG": "INFO"}, "hf_token_present": True},
              "ranks": {"0": {"argv": ["vllm", "serve", "--api-key", "k"], "env": {"VLLM_HOST_IP": "10.0.0.1"}}}}
    got = json.loads(mask(json.dumps(render)))
    assert got["recipe"] == render["recipe"]
    assert got["ranks"]["0"] == {"argv": ["vllm", "serve", "--api-key", MASK], "env": {"VLLM_HOST_IP": "10.0.0.1"}}


def test_text_that_only_looks_like_json_is_masked_as_text() -> None:
    text = '{"event": 1}\n{"api_key": "k"}\n'  # JSON lines: not one document
    assert mask(text) == '{"event": 1}\n{"api_key": "%s"}\n' % MASK


def test_anything_else_is_turned_into_text() -> None:
    assert mask(None) == ""
    assert mask(12) == "12"
    assert mask("no secret here, NCCL_DEBUG=INFO\n") == "no secret here, NCCL_DEBUG=INFO\n"


def test_the_documentation_parses() -> None:
    doc = yaml.safe_load(mt.DOCUMENTATION)
    assert doc["name"] == "mask_text" and doc["options"]["secrets"]["type"] == "list"
    yaml.safe_load(mt.EXAMPLES)
    yaml.safe_load(mt.RETURN)
