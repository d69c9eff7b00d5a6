"""Benchmarks: launch paths (``launch_paths``) and microcosts (``microcosts``). See benchmarks/."""
