"""A numpy emulator of the wafer-scale device: capture -> IR -> validate -> match -> place -> cost -> runtime."""
