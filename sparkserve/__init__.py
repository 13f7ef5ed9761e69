"""sparkserve: one command over the deployment playbooks, driven through ansible-runner."""
