"""Prefect integration: pipelines of DNN stages as tasks, and the ESG task runner."""
