"""Persistent respondent state: backends for gateway.state_store.state_api.StateStore."""
