"""The gateway in front of the deployments: its settings checked, and the files of its nginx rendered."""
