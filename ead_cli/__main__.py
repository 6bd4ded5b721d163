"""``python -m ead_cli``: the same as the ``ead`` command."""

from .cli import main

main()
