"""The hardware catalogue shared by the broker and the node agent. Standard library only."""
