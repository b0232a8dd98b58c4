"""Lowerings between irc's levels, one step a file."""
