"""Readers and writers for spmdcnn's files: model, plan and job YAML; checkpoint and dataset HDF5."""
