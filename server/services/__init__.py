"""Native service discovery: the registrations of ``service { provider = "nomad" }``."""
