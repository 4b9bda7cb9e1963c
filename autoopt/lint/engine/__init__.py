"""Running rules over files: the rule contract, the registry and selection, configuration,
discovery, the parallel runner, the results cache, suppressions and rule documentation."""
