"""Model presets: HF config.json files, index.yaml (names, aliases, sources) and PROVENANCE.md."""
