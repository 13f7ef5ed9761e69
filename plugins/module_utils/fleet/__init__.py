"""Several deployments on a few DGX Sparks, planned on the controller before any node is touched.

- ``memory``: a deployment's memory need on each of its nodes, and the weights' size from the hub;
- ``placement``: which nodes each deployment runs on, within every node's memory budget;
- ``ports``: the API and rendezvous ports of deployments that share nodes;
- ``deployments``: the deployments a cluster file lists.
"""
