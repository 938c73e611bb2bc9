"""Push delivery (contract section 12): the dispatcher, its HTTP client and outcomes."""
