"""Framework-neutral infrastructure shared by the TF and PyTorch runners and the device emulator."""
