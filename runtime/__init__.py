"""The code with no Django that the job runner and the serving host run (see README.md)."""
