"""The `kvstore` command line (click), a thin layer over the kvstore package."""
