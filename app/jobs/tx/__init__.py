"""The job transaction (uow.py) and the rules it applies inside it as a job moves: what its
end does to its dependents, its key's turn, its attempts."""
