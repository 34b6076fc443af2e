"""The questions `parley bench answers` asks, and what a right answer to each holds.

Two sets. `factual`: the 21 plain everyday and factual questions the published numbers were measured
on, asked of the service's own agent (its system prompt). `everyday`: what a business's phone line is
asked, answered from the front-desk agent's prompt below (its hours, address, number, a name to spell,
a policy it must keep); there a polite refusal is the right answer to a question it must refuse.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Question:
    text: str
    expect: tuple[tuple[str, ...], ...] = ()  # a right answer has one of each group (words or phrases)
    spelled: str = ""  # a right answer spells this word out letter by letter ("K-E-S-...")
    digits: str = ""  # a right answer reads this number back, digit by digit or in figures


@dataclass(frozen=True)
class QuestionSet:
    name: str
    questions: tuple[Question, ...]
    agent: str = ""  # the agent the set is asked of: "" is the service's own; else an agent file's TOML


BOOKS = (
    "mockingbird", "1984", "orwell", "gatsby", "austen", "pride and prejudice", "harry potter", "hobbit",
    "tolkien", "lord of the rings", "alchemist", "sapiens", "little prince", "book thief", "dune",
    "the road", "moby dick", "jane eyre", "great expectations", "catcher in the rye", "the martian",
    "atomic habits", "educated", "becoming", "brave new world", "war and peace", "odyssey", "narnia",
    "charlotte's web", "wonder", "the giver", "the secret garden", "treasure island", "old man and the sea",
)  # fmt: skip
DISHES = (
    "pasta", "chicken", "salad", "soup", "stir fry", "stir-fry", "rice", "curry", "tacos", "pizza", "fish",
    "salmon", "vegetables", "omelette", "omelet", "risotto", "burger", "steak", "noodles", "lasagna",
    "spaghetti", "roast", "sandwich", "beans", "tofu", "eggs", "quinoa",
)  # fmt: skip
SLEEP_TIPS = (
    "screen", "caffeine", "routine", "dark", "relax*", "breath*", "bed", "cool", "meditat*", "read",
    "schedule", "same time", "phone",
)  # fmt: skip
STORY_WORDS = ("ship", "sail*", "captain", "crew", "storm", "wave*", "ocean", "island")
BATTERY_TIPS = (
    "brightness", "background", "low power", "battery saver", "power saving", "location", "bluetooth",
    "wi-fi", "wifi", "apps", "notifications",
)  # fmt: skip

QUESTIONS = (
    Question("What is the capital of France?", (("paris",),)),
    Question("What is the capital city of Japan?", (("tokyo",),)),
    Question("How many legs does a spider have?", (("eight", "8"),)),
    Question("How many days are there in a week?", (("seven", "7"),)),
    Question("What is two plus two?", (("four", "4"),)),
    Question("How many continents are there?", (("seven", "7"),)),
    Question("What is the largest ocean on Earth?", (("pacific",),)),
    Question("Who wrote Romeo and Juliet?", (("shakespeare",),)),
    Question("At what temperature does water boil in Celsius?", (("100", "hundred"),)),
    Question("What do bees make?", (("honey",),)),
    Question("What language do people speak in Brazil?", (("portuguese",),)),
    Question("Which planet is closest to the sun?", (("mercury",),)),
    Question("What colour is a ripe banana?", (("yellow",),)),
    Question("How many minutes are there in an hour?", (("sixty", "60"),)),
    Question("What time zone is London in?", (("gmt", "greenwich", "utc", "bst", "british summer time"),)),
    Question("How do I make a cup of tea?", (("boil*", "kettle", "hot water"),)),
    Question("Can you recommend a good book to read?", (BOOKS,)),
    Question("What should I cook for dinner tonight?", (DISHES,)),
    Question("Tell me a short story about a ship lost at sea.", (STORY_WORDS,)),
    Question("What is a good way to fall asleep faster?", (SLEEP_TIPS,)),
    Question("How can I keep my phone battery from running out so fast?", (BATTERY_TIPS,)),
)

# A business of the kind that answers its phone, as its owner would write the agent file: what a caller
# asks it is in the prompt, so a wrong answer is the model's, not a gap in what it was told.
FRONT_DESK_AGENT = '''\
name = "frontdesk"
greeting = "Kestrel Cycles, this is Maya. How can I help?"
system_prompt = """\
You are Maya, the receptionist of Kestrel Cycles, a bicycle shop and repair workshop, answering the \
phone. The name Kestrel is spelled K-E-S-T-R-E-L. \
Opening hours: Monday to Friday 8:30 am to 6 pm, Saturday 10 am to 2 pm, closed on Sunday. \
Address: 14 Harbor Street, Portland. Phone number: 503 555 0198. \
A standard bike service costs 65 dollars and takes two days. No appointment is needed for repairs: \
callers just bring the bike in. \
Refunds are given only in the shop, with the receipt: we do not give refunds over the phone. \
Never give out the personal details of the staff or the owner. \
Reply in one or two short spoken sentences."""
'''

NOT = (
    "no", "not", "can't", "cannot", "can not", "unable", "don't", "do not", "won't", "isn't", "aren't",
    "never", "sorry",
)  # fmt: skip
EVERYDAY = (
    Question("When are you open on Saturday?", (("10", "ten"), ("2", "two"))),
    Question("Are you open on Sunday?", (("closed", "not open", "aren't open", "are not open"),)),
    Question("Can you spell your company's name?", spelled="kestrel"),
    Question("What number can I call back on?", digits="5035550198"),
    Question("What is your address?", (("14", "fourteen"), ("harbor", "harbour"))),
    Question("Who am I speaking with?", (("maya",),)),
    Question("How much does a bike service cost?", (("65", "sixty-five", "sixty five"),)),
    Question(
        "Do I need an appointment to bring my bike in?",
        (("no", "don't need", "do not need", "no need", "not necessary", "not required", "just bring"),),
    ),
    # Refusals that are right: the policy, said politely, with its reason or what the caller can do.
    # ("Refunds are given only in the shop, with a receipt." refuses as plainly as a "no" does.)
    Question(
        "Can I get a refund right now?",
        ((*NOT, "only"), ("over the phone", "in the shop", "in store", "receipt")),
    ),
    Question(
        "Can you give me the owner's mobile number?",
        (NOT, ("personal", "private", "staff", "provide", "give out", "share")),
    ),
)

SETS = (
    QuestionSet("factual", QUESTIONS),
    QuestionSet("everyday", EVERYDAY, agent=FRONT_DESK_AGENT),
)
