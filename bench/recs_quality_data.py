"""The UCI Online Retail data set as purchase events: loading, cleaning and the time split.

Online Retail: Chen, D. (2015), UCI Machine Learning Repository, https://doi.org/10.24432/C5BW33,
CC BY 4.0. The copy and its provenance are described in ../shared/data/README.md.

Cleaning (every dropped row is counted by reason, so the report can say what went):

- cancellations (an InvoiceNo starting with "C") and rows with a non-positive quantity or price;
- rows without a CustomerID (a purchase nobody can be recommended to);
- stock codes that are not products: postage, carriage, manual adjustments, bank charges, samples…
  (a product code is five digits with up to two letters, as in tidegate.demo.shop).

An invoice is one purchase event of one customer: its distinct stock codes, with the summed
quantities. Invoice times are UK local time (Europe/London, so GMT/BST) and become UTC here.
"""

from __future__ import annotations

import csv
import gzip
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from bench.common import BenchmarkError
from tidegate.testing import Item, categories_of

RETAIL_ZONE = ZoneInfo("Europe/London")
_PRODUCT_CODE = re.compile(r"^\d{5}[A-Z]{0,2}$")
_COLUMNS = ("InvoiceNo", "StockCode", "Description", "Quantity", "InvoiceDate", "UnitPrice", "CustomerID",
            "Country")


@dataclass(frozen=True, slots=True)
class Invoice:
    """One purchase: a customer's distinct items (in the invoice's line order) at a UTC time."""

    invoice_no: str
    customer: str
    at: datetime
    items: tuple[str, ...]
    quantities: tuple[int, ...]

    @property
    def local_day(self) -> date:
        """The retailer's calendar day of the invoice (a nightly batch retrains between days)."""
        return self.at.astimezone(RETAIL_ZONE).date()


@dataclass(frozen=True, slots=True)
class Dataset:
    """Every clean purchase in time order, and the catalogue of the products they name."""

    invoices: tuple[Invoice, ...]
    catalogue: dict[str, Item]
    rows_read: int
    rows_kept: int
    dropped: Counter[str]  # reason → rows


@dataclass(frozen=True, slots=True)
class Split:
    """History (fed before the evaluation starts) and the test period (evaluated, then fed)."""

    history: tuple[Invoice, ...]
    test: tuple[Invoice, ...]
    history_start: datetime
    test_start: datetime
    test_end: datetime


def load(path: Path) -> Dataset:
    """Read and clean `online_retail.csv.gz`; a missing or malformed file is a BenchmarkError
    that says where the data set comes from."""
    if not path.is_file():
        raise BenchmarkError(
            f"the Online Retail data set is not at {path}: this benchmark needs online_retail.csv.gz "
            "(UCI dataset 352, https://archive.ics.uci.edu/dataset/352/online+retail, CC BY 4.0); "
            "pass its path with --data")
    lines: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)  # (invoice, customer) → lines
    moments: dict[str, datetime] = {}
    descriptions: dict[str, Counter[str]] = defaultdict(Counter)
    prices: dict[str, Counter[float]] = defaultdict(Counter)
    dropped: Counter[str] = Counter()
    read = kept = 0
    try:
        with gzip.open(path, "rt", encoding="utf-8", newline="") as file:
            reader = csv.reader(file)
            header = next(reader, [])
            if tuple(header) != _COLUMNS:
                raise BenchmarkError(f"{path} is not the Online Retail layout: header {header}")
            for invoice_no, code, description, quantity, moment, price, customer, _country in reader:
                read += 1
                code = code.strip().upper()
                if invoice_no.startswith("C"):
                    dropped["cancellation"] += 1
                elif not customer:
                    dropped["no CustomerID"] += 1
                elif not _PRODUCT_CODE.match(code):
                    dropped[f"not a product: {code if code in _NAMED_FEES else 'other'}"] += 1
                elif int(quantity) <= 0 or float(price) <= 0:
                    dropped["quantity or price <= 0"] += 1
                else:
                    kept += 1
                    lines[(invoice_no, str(int(float(customer))))].append((code, int(quantity)))
                    if invoice_no not in moments:
                        local = datetime.fromisoformat(moment).replace(tzinfo=RETAIL_ZONE)
                        moments[invoice_no] = local.astimezone(UTC)
                    if description.strip():
                        descriptions[code][description.strip()] += 1
                    prices[code][float(price)] += 1
    except (OSError, EOFError, ValueError, csv.Error) as exc:
        raise BenchmarkError(f"cannot read {path}: {exc}") from exc
    invoices = [_invoice(no, customer, moments[no], items) for (no, customer), items in lines.items()]
    invoices.sort(key=lambda inv: (inv.at, inv.invoice_no))
    catalogue = {code: _item(code, descriptions.get(code), prices[code]) for code in prices}
    return Dataset(tuple(invoices), catalogue, read, kept, dropped)


# Fee and adjustment codes named in the report; any other non-product code counts as "other".
_NAMED_FEES = frozenset({"POST", "DOT", "M", "C2", "BANK CHARGES", "PADS", "AMAZONFEE", "CRUK", "D", "S"})


def _invoice(invoice_no: str, customer: str, at: datetime, lines: Sequence[tuple[str, int]]) -> Invoice:
    quantities: dict[str, int] = {}
    for code, quantity in lines:  # a product on several lines of one invoice is one purchase
        quantities[code] = quantities.get(code, 0) + quantity
    return Invoice(invoice_no, customer, at, tuple(quantities), tuple(quantities.values()))


def _item(code: str, descriptions: Counter[str] | None, prices: Counter[float]) -> Item:
    """The product as the shop would list it: its most frequent description and unit price."""
    description = descriptions.most_common(1)[0][0] if descriptions else ""
    return Item(item_id=code, name=description.title(), description=description.capitalize(),
                categories=tuple(categories_of(description)), price=prices.most_common(1)[0][0])


def split(dataset: Dataset, *, history_start: datetime, test_start: datetime, test_end: datetime) -> Split:
    """Invoices in [history_start, test_start) are history, those in [test_start, test_end) the
    test period; the bounds are UK local midnights given as aware datetimes."""
    if not history_start < test_start < test_end:
        raise BenchmarkError(f"the split needs history start < test start < test end, got "
                             f"{history_start:%Y-%m-%d}, {test_start:%Y-%m-%d}, {test_end:%Y-%m-%d}")
    history = tuple(inv for inv in dataset.invoices if history_start <= inv.at < test_start)
    test = tuple(inv for inv in dataset.invoices if test_start <= inv.at < test_end)
    if not history or not test:
        raise BenchmarkError(f"the split leaves {len(history)} history and {len(test)} test invoices: "
                             "choose dates inside 2010-12-01 … 2011-12-09")
    return Split(history, test, history_start, test_start, test_end)


def local_midnight(day: date) -> datetime:
    """The start of a UK calendar day, as an aware datetime."""
    return datetime(day.year, day.month, day.day, tzinfo=RETAIL_ZONE)


@dataclass(frozen=True, slots=True)
class Month:
    """One test month [start, end) of a multi-month evaluation (UK calendar days)."""

    start: date
    end: date

    @property
    def label(self) -> str:
        return f"{self.start} … {self.end - timedelta(days=1)}"


def months_back(day: date, months: int) -> date:
    """`day` moved back `months` calendar months (the day of the month clipped to the month's end)."""
    index = day.year * 12 + day.month - 1 - months
    year, month = divmod(index, 12)
    month += 1
    last = (date(year + month // 12, month % 12 + 1, 1) - timedelta(days=1)).day
    return date(year, month, min(day.day, last))


def last_months(last_start: date, last_end: date, count: int, *,
                skip: Sequence[tuple[date, date]] = (), first_day: date | None = None) -> list[Month]:
    """The last `count` test months, oldest first: the last is [last_start, last_end); each
    earlier one starts a calendar month before the next one's start and ends at the earlier of
    its own end moved back a month and the next one's start. A month overlapping a stretch in
    `skip` (where settings were chosen) is passed over, and so is one starting before
    `first_day` (where the data begins): the result then holds fewer months."""
    if count <= 0:
        raise BenchmarkError(f"the number of test months must be positive, got {count}")
    if not last_start < last_end:
        raise BenchmarkError(f"the last test month needs start < end, got {last_start}, {last_end}")
    found: list[Month] = []
    start, end, back = last_start, last_end, 0
    while len(found) < count:
        if first_day is not None and start <= first_day:
            break
        if not any(start < skip_end and skip_start < end for skip_start, skip_end in skip):
            found.append(Month(start, end))
        back += 1
        start, end = months_back(last_start, back), min(months_back(last_end, back), start)
    return found[::-1]
