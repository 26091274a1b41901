"""`python -m onebox` runs the `onebox` command line."""

from onebox.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
