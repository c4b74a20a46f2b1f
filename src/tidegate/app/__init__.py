"""Composition roots: the code that opens the parts of a process and wires them together
(`tidegate up`, `gateway`, `worker`, `sync`, and the recommender the change flow feeds)."""
