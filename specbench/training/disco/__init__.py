"""DISCO's train → tune → test pipeline (features, classifier training, tuning on validation, tables)."""
