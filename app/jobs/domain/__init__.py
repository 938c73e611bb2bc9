"""Jobs as plain data and rules: the job record, its transitions, what an enqueue asks for,
the dependency graph, uniqueness, the claim's flow policy. No SQL, no HTTP."""
