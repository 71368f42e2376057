"""The platform's extension of Label Studio 1.23.2, loaded into Label Studio's own process.

Not part of the platform's venv: Label Studio's venv runs it, with this directory's parent on
its ``PYTHONPATH`` (``platform/label_studio.py`` sets it up). ``settings`` is the Django settings
module Label Studio runs with; ``manage`` is the command the platform drives organisations
and accounts with.
"""
