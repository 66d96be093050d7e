"""Thin adapters from the ports to Google's libraries. Library errors stop here."""
