"""Where queuelog meets its database: the schema, the engine, the only dialect branches, the
group commit, the driver statements, and the unit of work services receive."""
