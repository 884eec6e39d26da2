"""A job's description, shared by the launcher (a client) and the master."""
