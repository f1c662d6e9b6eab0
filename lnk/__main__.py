"""``python -m lnk`` runs the CLI."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["--served-by"] and len(sys.argv) > 2:
        # a move's step for this machine's lnk server: wait for it, importing little
        from lnk.transport import served

        served.call(sys.argv[2], sys.argv[3:])
        del sys.argv[1:3]  # no server answered: the step runs here
    from lnk.cli.main import main

    main()
