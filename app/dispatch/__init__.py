"""Push delivery (docs/PUSH.md): the dispatcher, its HTTP client and outcomes."""
