"""Helpers shared by several test modules (servers, fixtures); not tests themselves."""
