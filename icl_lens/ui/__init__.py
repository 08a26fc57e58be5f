"""Front ends of icl_lens: CLI subcommands, dashboards."""
