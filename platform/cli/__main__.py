"""`python -m riverbed.cli`: the same as the `riverbed` command."""

from riverbed.cli.main import main

main()
