"""meshplan command line (typer + rich). Parsing and rendering only; logic lives in the library packages."""
