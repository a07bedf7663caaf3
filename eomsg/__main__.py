"""``python -m eomsg``: the ``eomsg`` command."""

from eomsg.cli.app import main

main()
