"""``python -m lnk`` runs the CLI."""

from lnk.cli.main import main

if __name__ == "__main__":
    main()
