"""The cli room: the ``meshplan`` commands (typer + rich); each parses, calls one library function, renders.
It may import every room; nothing imports it."""
