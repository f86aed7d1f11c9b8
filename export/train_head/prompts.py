"""The training prompt recipe: TOPICS x TEMPLATES, shuffled by a fixed seed (our own text, licence: the project's,
Apache-2.0). None of it comes from an evaluation set: the held-out chat prompts (specbench-style) are never read.

    recipe_prompts(n)[i] is the same string on every machine and version of NumPy that keeps default_rng's PCG64
    stream, so a data set is named by (recipe version, n) and its hash.
"""
from __future__ import annotations

import numpy as np

RECIPE_VERSION = 1
RECIPE_LICENCE = "Apache-2.0 (specedge's own prompt recipe, export/train_head/prompts.py)"
SEED = 42

TOPICS = (
    # science and nature
    "photosynthesis", "black holes", "plate tectonics", "the water cycle", "vaccines", "DNA replication",
    "climate change", "volcanoes", "the immune system", "gravity", "electricity", "magnetism", "the periodic table",
    "evolution by natural selection", "coral reefs", "rainforests", "the moon's phases", "solar eclipses",
    "ocean tides", "earthquakes", "the human heart", "sleep", "bees and pollination", "antibiotics", "light waves",
    "sound waves", "the speed of light", "atoms", "chemical bonds", "the greenhouse effect", "glaciers",
    "hurricanes", "the nervous system", "migrating birds", "fungi", "bacteria", "the solar system", "Mars",
    "comets", "the big bang", "renewable energy", "nuclear power", "batteries", "recycling", "deserts",
    "the carbon cycle", "dinosaurs", "whales", "octopuses", "the human brain",
    # technology and computing
    "binary numbers", "the internet", "public key cryptography", "machine learning", "databases", "sorting algorithms",
    "recursion", "hash tables", "operating systems", "compilers", "version control with git", "unit testing",
    "HTTP requests", "cloud computing", "computer memory", "CPU caches", "open source software", "Linux",
    "regular expressions", "JSON", "SQL queries", "Python lists", "Python dictionaries", "object-oriented programming",
    "functional programming", "REST APIs", "password security", "two-factor authentication", "spreadsheets",
    "smartphones", "GPS", "3D printing", "robots", "electric cars", "solar panels", "Wi-Fi", "email",
    "search engines", "video compression", "digital photography", "the command line", "debugging",
    "code review", "web browsers", "HTML and CSS", "JavaScript", "linked lists", "binary search", "graph algorithms",
    "neural networks",
    # everyday life and skills
    "cooking pasta", "baking bread", "making coffee", "brewing tea", "a healthy breakfast", "meal planning",
    "saving money", "making a budget", "job interviews", "writing a resume", "public speaking", "time management",
    "learning a new language", "learning to swim", "riding a bicycle", "running a marathon", "yoga", "meditation",
    "gardening", "growing tomatoes", "houseplants", "keeping chickens", "adopting a dog", "training a puppy",
    "caring for a cat", "moving to a new city", "packing for a trip", "camping", "hiking safely", "first aid",
    "fire safety", "cleaning a kitchen", "doing laundry", "fixing a flat tire", "painting a room", "woodworking",
    "knitting", "photography for beginners", "playing chess", "playing the guitar", "learning the piano",
    "writing a short story", "keeping a journal", "reading more books", "making friends as an adult",
    "dealing with stress", "staying hydrated", "getting better sleep", "remote work", "studying for exams",
    # history, society and culture
    "the printing press", "ancient Rome", "ancient Egypt", "the Silk Road", "the industrial revolution",
    "the invention of the telephone", "the history of writing", "democracy", "taxes", "inflation",
    "supply and demand", "the stock market", "small businesses", "libraries", "museums", "public transport",
    "city planning", "the Olympic games", "football", "jazz music", "classical music", "the history of cinema",
    "poetry", "theatre", "architecture", "bridges", "castles", "maps", "calendars", "clocks", "money",
    "trade", "farming", "fishing", "the postal service", "newspapers", "volunteering", "recycling programs",
    "community gardens", "board games", "video games", "festivals", "weddings", "birthdays", "holidays",
    "folk tales", "mythology", "philosophy", "ethics", "logic puzzles",
    # mathematics
    "prime numbers", "fractions", "percentages", "probability", "statistics", "the Pythagorean theorem",
    "geometry", "algebra", "calculus", "compound interest", "averages", "negative numbers", "exponents",
    "logarithms", "graphs of functions", "matrices", "infinity", "the number pi", "symmetry", "estimation",
)

TEMPLATES = (
    "Explain {t} to a ten-year-old.",
    "What is {t}? Answer in a short paragraph.",
    "Give me three interesting facts about {t}.",
    "Write a short poem about {t}.",
    "Summarize the most important ideas of {t} in a few sentences.",
    "What are common misconceptions about {t}?",
    "How would you teach {t} to a beginner? Give a step-by-step plan.",
    "Write a friendly email to a colleague about {t}.",
    "List the pros and cons of {t}.",
    "Why does {t} matter in everyday life?",
    "Write a short story in which {t} plays a central role.",
    "Compare {t} with something similar and explain the differences.",
    "What questions should I ask to learn more about {t}?",
    "Describe the history of {t} briefly.",
    "Give a simple analogy that explains {t}.",
    "Write a tweet-length summary of {t}.",
    "What are the first three things a beginner should know about {t}?",
    "Create a short quiz with three questions about {t}, with answers.",
    "Explain {t} as if you were a museum guide.",
    "Write a dialogue between a student and a teacher about {t}.",
    "What would happen if {t} did not exist?",
    "Give me a checklist for getting started with {t}.",
    "Describe {t} in exactly five bullet points.",
    "What is a good way to remember the basics of {t}?",
    "Write an introduction for a blog post about {t}.",
    "Explain {t} in simple terms, then give one example.",
    "What careers or hobbies involve {t}?",
    "Tell me a fun fact about {t} and explain why it is true.",
    "Write a haiku about {t}.",
    "What are the key terms someone should know about {t}? Define each one.",
    "I am confused about {t}. Can you help me understand it?",
    "Outline a five-minute talk about {t}.",
)


def recipe_size() -> int:
    return len(TOPICS) * len(TEMPLATES)


def recipe_prompts(n: int) -> list[str]:
    """The first n prompts of the recipe's fixed shuffle (every topic x template pair at most once)."""
    total = recipe_size()
    if not 1 <= n <= total:
        raise ValueError(f"the prompt recipe has {total} prompts ({len(TOPICS)} topics x {len(TEMPLATES)} "
                         f"templates); ask for 1..{total}, not {n}")
    order = np.random.default_rng(SEED).permutation(total)[:n]
    return [TEMPLATES[i % len(TEMPLATES)].format(t=TOPICS[i // len(TEMPLATES)]) for i in order]
