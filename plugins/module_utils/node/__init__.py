"""sparkserve's node library: what the node programs and the collection's modules share.

One package, standard library only, with relative imports among its own files, so that it imports under two
names: ``ansible_collections.sparkserve.deploy.plugins.module_utils.node`` in the modules (AnsiballZ ships what
a module imports) and ``sparkserve_node`` on the nodes, where the sparkserve role (tasks/node_library.yml)
installs it once into ``sparkserve_node_library_dir`` and the systemd units of the memory guard, the flusher
and the supervisor put that folder on ``PYTHONPATH``. It runs on the nodes' system python3 (3.10 or later on
the Sparks): no syntax newer than 3.10.

* ``meminfo``: /proc/meminfo, parsed once.
* ``files``: the atomic replace of a file, and the appended JSON line.
* ``lock``: the deployments' launch-lock files (the deployment_lock module and the supervisor).
* ``textfile``: node_exporter's textfile (the programs' metrics, and the prometheus_textfile filter's text).
* ``process``: a command with a timeout, on this node or on a peer over ssh.
* ``docker``: what ``docker inspect`` says of a container's state.
* ``api``: the requests of the readiness probe of an OpenAI-compatible engine.
* ``perftest``: what ib_write_bw printed (a link's figures, or why it gave none) and the gate on a link's floor.
* ``config``: reading and checking a program's JSON config.
* ``lifecycle``: log lines and SIGTERM.
* ``supervisor``: the supervisor program's own modules (roles/supervisor/files/sparkserve-supervisor.py).
"""
