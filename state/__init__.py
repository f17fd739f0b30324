"""Persistent respondent state: backends for gateway.state_api.StateStore."""
