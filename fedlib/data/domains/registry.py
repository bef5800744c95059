"""The feature-shift data sets, their domains (clients, in order), class lists and defaults.

A run's config is checked against these before any data is read, so an unknown data set or domain, or a
percent outside (0, 1], is refused naming the parameter and what is allowed.
"""

from __future__ import annotations

import re

DOMAINS: dict[str, tuple[str, ...]] = {
    "digits": ("mnist", "svhn", "usps", "synthdigits", "mnist_m"),
    "office31": ("amazon", "dslr", "webcam"),
    "officehome": ("Art", "Clipart", "Product", "Real World"),
    "domainnet": ("clipart", "infograph", "painting", "quickdraw", "real", "sketch"),
}
DATASETS = tuple(DOMAINS)

CLASSES: dict[str, tuple[str, ...]] = {
    "digits": tuple(str(d) for d in range(10)),
    "office31": tuple(
        sorted(
            (
                "back_pack",
                "bike",
                "bike_helmet",
                "bookcase",
                "bottle",
                "calculator",
                "desk_chair",
                "desk_lamp",
                "desktop_computer",
                "file_cabinet",
                "headphones",
                "keyboard",
                "laptop_computer",
                "letter_tray",
                "mobile_phone",
                "monitor",
                "mouse",
                "mug",
                "paper_notebook",
                "pen",
                "phone",
                "printer",
                "projector",
                "punchers",
                "ring_binder",
                "ruler",
                "scissors",
                "speaker",
                "stapler",
                "tape_dispenser",
                "trash_can",
            )
        )
    ),
    "officehome": tuple(
        sorted(
            (
                "Alarm_Clock",
                "Backpack",
                "Batteries",
                "Bed",
                "Bike",
                "Bottle",
                "Bucket",
                "Calculator",
                "Calendar",
                "Candles",
                "Chair",
                "Clipboards",
                "Computer",
                "Couch",
                "Curtains",
                "Desk_Lamp",
                "Drill",
                "Eraser",
                "Exit_Sign",
                "Fan",
                "File_Cabinet",
                "Flipflops",
                "Flowers",
                "Folder",
                "Fork",
                "Glasses",
                "Hammer",
                "Helmet",
                "Kettle",
                "Keyboard",
                "Knives",
                "Lamp_Shade",
                "Laptop",
                "Marker",
                "Monitor",
                "Mop",
                "Mouse",
                "Mug",
                "Notebook",
                "Oven",
                "Pan",
                "Paper_Clip",
                "Pen",
                "Pencil",
                "Postit_Notes",
                "Printer",
                "Push_Pin",
                "Radio",
                "Refrigerator",
                "Ruler",
                "Scissors",
                "Screwdriver",
                "Shelf",
                "Sink",
                "Sneakers",
                "Soda",
                "Speaker",
                "Spoon",
                "TV",
                "Table",
                "Telephone",
                "ToothBrush",
                "Toys",
                "Trash_Can",
                "Webcam",
            )
        )
    ),
    # FedBN's DomainNet label_dict (utils/data_utils.py), its "top 10 most common classes".
    "domainnet": (
        "bird",
        "feather",
        "headphones",
        "ice_cream",
        "teapot",
        "tiger",
        "whale",
        "windmill",
        "wine_glass",
        "zebra",
    ),
}
assert len(CLASSES["office31"]) == 31 and len(CLASSES["officehome"]) == 65

DEFAULT_SIZE = {"digits": 28, "office31": 224, "officehome": 224, "domainnet": 256}
DEFAULT_PERCENT = {"digits": 0.1, "office31": 1.0, "officehome": 1.0, "domainnet": 1.0}
FEDBN_TRAIN_BASE = 7438  # USPS pooled training images: FedBN's per-domain 100 % (10 % = 743)
TEST_FRAC = 0.2  # per-domain test share where we split (FedBN digits preprocessing: 0.2)


def _norm(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


def domain_names(dataset: str, domains=None) -> tuple[str, ...]:
    """The domains (clients, in order) a load of ``dataset`` with ``domains`` gives; checks the names."""
    if dataset not in DOMAINS:
        raise ValueError(f"dataset={dataset!r}: must be one of {', '.join(DATASETS)}")
    if domains is None:
        return DOMAINS[dataset]
    if isinstance(domains, str) or not isinstance(domains, (tuple, list)) or len(domains) == 0:
        raise ValueError(
            f"domains={domains!r}: must be a non-empty tuple of {dataset} domains: {', '.join(DOMAINS[dataset])}"
        )
    bad = [d for d in domains if d not in DOMAINS[dataset]]
    if bad:
        raise ValueError(
            f"domains={tuple(domains)!r}: unknown {dataset} domain(s) {', '.join(map(repr, bad))}; "
            f"allowed: {', '.join(DOMAINS[dataset])}"
        )
    if len(set(domains)) != len(domains):
        raise ValueError(f"domains={tuple(domains)!r}: a domain may appear only once")
    return tuple(domains)


def _check_percent(percent) -> float:
    if isinstance(percent, bool) or not isinstance(percent, (int, float)) or not 0 < percent <= 1:
        raise ValueError(f"percent={percent!r}: must be in (0, 1]")
    return float(percent)
