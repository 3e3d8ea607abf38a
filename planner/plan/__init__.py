"""The plan room: the ``Plan`` value and its file (schema), and how one is built from a priced layout and read back
into one (build). Exporters see ``schema`` only."""
