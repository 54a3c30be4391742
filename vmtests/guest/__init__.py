"""The reference guest and the instrumentation contract every guest follows."""
