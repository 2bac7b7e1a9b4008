"""The mixed-length sentences both embedding benchmarks use; also written
to benchmarks/sentences.txt (one per line) for `silica embed --file`."""

_BASE = [
    "The weather is lovely today.",
    "It's so sunny outside!",
    "He drove to the stadium.",
    "A man is playing a guitar on the street corner while people walk by.",
    "Quantum computers use qubits, which can be in a superposition of states, to solve certain problems faster.",
    "The quick brown fox jumps over the lazy dog.",
    "In 1969, astronauts landed on the Moon for the first time, a milestone watched by millions around the world on television.",
    "Rust guarantees memory safety without a garbage collector.",
]

# 256 sentences of 5 to ~120 words: each base sentence, repeated 1 to 4 times
SENTENCES = [" ".join([_BASE[i % len(_BASE)]] * (1 + (i * 7) % 4)) + f" ({i})" for i in range(256)]

if __name__ == "__main__":
    import os
    with open(os.path.join(os.path.dirname(__file__), "sentences.txt"), "w") as f:
        f.write("\n".join(SENTENCES) + "\n")
