"""Code that runs inside the sandbox, started by a bare `python -I`: it imports nothing from
gspo_cli, and the modules import each other by their plain names (runner puts this folder on
sys.path)."""
