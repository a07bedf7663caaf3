"""``python -m eomsg``: the ``eomsg`` command."""

from eomsg.cli import main

main()
