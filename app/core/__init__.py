"""queuelog's vocabulary: statuses, priorities, roles, the claim order, the limits, the clock
and the domain errors. A leaf: it imports nothing of queuelog's, and everything may import it."""
