"""The training prompt recipe (our own text, licence: the project's, Apache-2.0). None of it comes from an
evaluation set: the held-out chat prompts (specbench-style) are never read.

Version 2 mixes six kinds of prompt, in a fixed pattern of ten (`PATTERN`), each kind's own list in a fixed
shuffle (numpy default_rng, seed 42):

    topic      TOPICS x TEMPLATES (explain, list, write a poem about, ...)          3 in 10
    translate  German sentences made from SUBJECTS x PREDICATES x TIMES x CLAUSES,   2 in 10
               "Translate German to English: ..."
    math       word problems (MATH frames, numbers drawn from the seed)              2 in 10
    qa         short factual questions on a topic (QA frames)                         1 in 10
    summarize  "Summarize: <passage>"                                                1 in 10
    rag        "<passage>" + a question on it (RAG frames)                           1 in 10

A passage is the target's own answer to an earlier topic prompt of the recipe (`RecipePrompt.source`): the data
step fills it in (data.py), so those prompts depend on the target, and the prompt with its source's answer is what
the shards keep. recipe(n)[i] is the same on every machine and version of NumPy that keeps default_rng's PCG64
stream, so a data set is named by (recipe version, n, target file) and its hash.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RECIPE_VERSION = 2
RECIPE_LICENCE = "Apache-2.0 (specedge's own prompt recipe, export/train_head/prompts.py)"
SEED = 42
PASSAGE = "{passage}"  # where a passage prompt takes its source's answer

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


QA = (
    "Who is best known for work on {t}?",
    "When did people first start to study {t}?",
    "Where can I learn about {t} near me?",
    "What is the single most important fact about {t}?",
    "Which famous book or film is about {t}?",
    "How old is the idea of {t}?",
    "Who would use {t} in their job?",
    "What is the opposite of {t}, if there is one?",
)

# German sentences, subject (third person singular) + hat + time + object + participle + clause
SUBJECTS = (
    "Die Regierung", "Der Bürgermeister der Stadt", "Eine junge Ärztin aus Berlin", "Das Unternehmen",
    "Der Trainer des Vereins", "Eine Sprecherin der Polizei", "Der Autor des Buches", "Die Schule",
    "Ein Nachbar", "Die Europäische Kommission", "Der Verein", "Die Studentin", "Das Museum",
    "Der Vorstand der Bank", "Die Gemeinde", "Ein Sprecher des Ministeriums",
)
PREDICATES = (
    ("neue Regeln für den Wohnungsmarkt", "vorgestellt"), ("einen Plan zur Rettung des alten Bahnhofs",
                                                           "angekündigt"),
    ("die Preise für Strom und Gas", "erhöht"), ("mehr Geld für Schulen und Kindergärten", "gefordert"),
    ("das Ergebnis der Wahl", "kritisiert"), ("einen wichtigen Vertrag mit zwei Partnern", "unterschrieben"),
    ("ein neues Krankenhaus in der Innenstadt", "eröffnet"), ("die Zusammenarbeit mit den Nachbarländern",
                                                             "verstärkt"),
    ("den Bau einer neuen Brücke über den Fluss", "gestoppt"), ("hohe Verluste im dritten Quartal", "gemeldet"),
    ("einen Rekord bei den Besucherzahlen", "verzeichnet"), ("die Vorwürfe gegen den Vorstand", "zurückgewiesen"),
    ("eine Studie über die Folgen des Klimawandels", "veröffentlicht"), ("das Spiel gegen den Tabellenführer",
                                                                       "gewonnen"),
    ("die Entscheidung des Gerichts", "begrüßt"), ("hundert neue Arbeitsplätze", "geschaffen"),
    ("die Öffnungszeiten im Winter", "verlängert"), ("einen Preis für junge Künstler", "verliehen"),
)
TIMES = (
    "am Montag", "am Dienstag", "in der vergangenen Woche", "gestern Abend", "überraschend",
    "nach langen Verhandlungen", "im Sommer", "am Wochenende", "zum ersten Mal", "trotz heftiger Kritik",
)
CLAUSES = (
    "", ", wie die Zeitung berichtet", ", obwohl viele Bürger dagegen protestiert hatten",
    ", um die Kosten zu senken", ", weil die Lage immer schwieriger wird", ", teilte ein Sprecher mit",
)
TRANSLATE = ("Translate German to English: {s}", "Translate German to English: {s}",
             "Translate this German sentence into English: {s}")

NAMES = ("Anna", "Ben", "Carla", "David", "Emma", "Felix", "Grace", "Hassan", "Ines", "Jonas", "Keiko", "Liam",
         "Maria", "Noah", "Olga", "Pedro")
MATH = (
    "{n} has {a} apples. {n} buys {b} more bags with {c} apples in each. How many apples does {n} have now?",
    "A train travels at {d} km per hour for {b} hours, then at {g} km per hour for 2 hours. How far does it go "
    "in total?",
    "A jacket costs ${d}. It is on sale for {p}% off. How much does it cost on sale?",
    "{n} earns ${d} per hour and works {b} hours a week. How much does {n} earn in {c} weeks?",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
    "There are {a} students in a school. {p}% of them walk to school and the rest take the bus. How many take "
    "the bus?",
    "{n} reads {b} pages a day. How many days does {n} need to finish a book of {a} pages?",
    "A recipe needs {b} cups of flour for {c} cookies. How many cups are needed for {a} cookies?",
    "{n} is {b} years old. Their brother is {c} years older. How old will the brother be in {e} years?",
    "A farmer has {a} chickens and {b} cows. How many legs do the animals have in total?",
    "A tank holds {a} liters and fills at {b} liters per minute. How many minutes does it take to fill the "
    "tank from empty?",
    "{n} buys {b} notebooks at ${c} each and pays with a ${f} bill. How much change does {n} get?",
    "A shop sold {a} ice creams on Saturday and {p}% more on Sunday. How many did it sell over the weekend?",
    "{n} saves ${d} every week. How many weeks until {n} has saved ${a}?",
)
MATH_SUFFIX = ("", " Think step by step.", " Explain your answer.", "")

SUMMARIZE = ("Summarize: {passage}", "Summarize: {passage}", "Summarize the following text in two sentences.\n\n"
             "{passage}", "Write a one-paragraph summary of this text: {passage}")
RAG = (
    "{passage}\n\nBased on the text above, what is the main point about {t}?",
    "Read the passage and answer the question.\n\n{passage}\n\nQuestion: What does the passage say about {t}?",
    "{passage}\n\nQuestion: According to the text, why does {t} matter?",
    "Context: {passage}\n\nUsing only the context, list two facts it gives about {t}.",
)

# the kinds in each group of ten prompts; a passage takes the earliest topic prompt no passage has taken yet
PATTERN = ("topic", "translate", "math", "topic", "qa", "translate", "summarize", "math", "topic", "rag")
KINDS = ("topic", "translate", "math", "qa", "summarize", "rag")


@dataclass(frozen=True)
class RecipePrompt:
    kind: str
    text: str  # a passage prompt holds PASSAGE where its source's answer goes
    source: int | None = None  # summarize / rag: the index of the topic prompt whose answer is the passage


def _topic(i: int) -> tuple[str, str]:
    t = TOPICS[i // len(TEMPLATES)]
    return t, TEMPLATES[i % len(TEMPLATES)].format(t=t)


def _translate(i: int) -> str:
    rest, c = divmod(i, len(CLAUSES))
    rest, tm = divmod(rest, len(TIMES))
    s, pr = divmod(rest, len(PREDICATES))
    obj, part = PREDICATES[pr]
    sentence = f"{SUBJECTS[s]} hat {TIMES[tm]} {obj} {part}{CLAUSES[c]}."
    return TRANSLATE[i % len(TRANSLATE)].format(s=sentence)


def _math(rng: np.random.Generator) -> str:
    frame = MATH[int(rng.integers(len(MATH)))]
    a, b, c = int(rng.integers(20, 500)), int(rng.integers(2, 20)), int(rng.integers(2, 12))
    d, e, g = int(rng.integers(10, 80)), int(rng.integers(2, 30)), int(rng.integers(40, 160))
    p, f = int(rng.choice([10, 15, 20, 25, 30, 40, 50])), int(rng.choice([50, 100]))
    return frame.format(n=NAMES[int(rng.integers(len(NAMES)))], a=a, b=b, c=c, d=d, e=e, f=f, g=g, p=p) + \
        MATH_SUFFIX[int(rng.integers(len(MATH_SUFFIX)))]


def _sizes() -> dict[str, int]:
    return {"topic": len(TOPICS) * len(TEMPLATES), "translate": len(SUBJECTS) * len(PREDICATES) * len(TIMES) *
            len(CLAUSES), "qa": len(TOPICS) * len(QA)}


def recipe_size() -> int:
    """Prompts before a kind with a finite list runs out (topic prompts: 3 in 10)."""
    sizes, per = _sizes(), {k: PATTERN.count(k) for k in KINDS}
    return min(sizes[k] // per[k] for k in sizes) * len(PATTERN)


def recipe(n: int) -> list[RecipePrompt]:
    """The first n prompts of the recipe (each kind's list in its fixed shuffle, no prompt twice)."""
    total = recipe_size()
    if not 1 <= n <= total:
        raise ValueError(f"the prompt recipe has {total} prompts (version {RECIPE_VERSION}: six kinds, "
                         f"{len(TOPICS)} topics); ask for 1..{total}, not {n}")
    rng = np.random.default_rng(SEED)
    orders = {k: iter(rng.permutation(size)) for k, size in _sizes().items()}
    math_rng = np.random.default_rng([SEED, 1])
    kinds = [PATTERN[i % len(PATTERN)] for i in range(n)]
    out: list[RecipePrompt] = []
    topics: list[tuple[int, str]] = []  # (index in out, topic) of topic prompts not yet a passage
    for kind in kinds:
        if kind == "topic":
            t, text = _topic(int(next(orders["topic"])))
            topics.append((len(out), t))
            out.append(RecipePrompt(kind, text))
        elif kind == "translate":
            out.append(RecipePrompt(kind, _translate(int(next(orders["translate"])))))
        elif kind == "math":
            out.append(RecipePrompt(kind, _math(math_rng)))
        elif kind == "qa":
            i = int(next(orders["qa"]))
            out.append(RecipePrompt(kind, QA[i % len(QA)].format(t=TOPICS[i // len(QA)])))
        else:
            source, t = topics.pop(0)
            frames = SUMMARIZE if kind == "summarize" else RAG
            frame = frames[len(out) // len(PATTERN) % len(frames)]
            out.append(RecipePrompt(kind, frame.replace("{t}", t), source))
    return out


def recipe_prompts(n: int) -> list[str]:
    """The first n prompts' texts, a passage prompt still holding PASSAGE (data.py fills it in)."""
    return [p.text for p in recipe(n)]
