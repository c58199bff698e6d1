#!/usr/bin/env python3
"""Generate the CME energy calendar table and the CL test vectors.

Writes, relative to the repository root:

  shared/data/cme_calendar.json  the versioned holiday table that shared/src/domain/calendar.rs
                                 embeds (data, not code)
  shared/data/cl_vectors.json    test vectors checked by the unit tests in calendar.rs and cl.rs

HOW TO RUN (by hand, never in CI: it needs pandas_market_calendars from PyPI, which CI does not
install, and its output is committed):

    python3 -m venv /tmp/venv-pmc
    /tmp/venv-pmc/bin/pip install 'pandas_market_calendars==5.5.0'
    /tmp/venv-pmc/bin/python tools/gen_cl_vectors.py           # rewrite both files
    /tmp/venv-pmc/bin/python tools/gen_cl_vectors.py --check   # exit 1 if a file would change

then `CARGO_TARGET_DIR=/work/main/target cargo test -p airlock-shared --lib domain::`, and
commit the two data files together with this script. Bump VERSION below whenever the table
changes (the Rust side reports it through ExchangeCalendar::version()).

WHAT IT DOES

1. Builds the table from the holiday rules below (pure standard library, no pandas): the full
   closures, the early-halt holidays and the early-close business days of CME Globex energy (CL)
   for FIRST_YEAR..=LAST_YEAR, with observed dates for holidays that fall on a weekend.

2. Cross-checks the table against pandas_market_calendars (pmc), an independent implementation:
   its "CMEGlobex_Energy" calendar (Globex session open/close per trade date) and its
   "CME_TradeDate" calendar (the business days CME uses for expiries). Every difference must be
   one of the documented DISAGREEMENTS below, or the script stops.

3. Writes the test vectors from pmc, not from the table: market open/closed (with the next close
   or re-open instant) at many UTC instants, and the last trade date of every CL contract of
   2020..2038 computed with pmc's business days. Where the table deliberately disagrees with pmc
   (the list below), the vector follows the table and carries a "note" saying what pmc says.

THE RULES (CME Group holiday calendar for CME Globex energy; NYMEX CL rulebook chapter 200)

* Regular Globex hours: Sunday 17:00 to Friday 16:00 America/Chicago, with a daily halt 16:00 to
  17:00 Monday to Thursday. A trade date D's session runs from 17:00 CT on the evening before D
  (Sunday for Monday) to 16:00 CT on D.
* Full closures (no session; not business days): New Year's Day (Jan 1; a Sunday is observed on
  Monday; a Saturday is NOT observed, Friday Dec 31 trades normally), Good Friday (Easter - 2),
  Christmas Day (Dec 25; Saturday -> Friday Dec 24, Sunday -> Monday Dec 26). Globex re-opens at
  17:00 CT on the closed day for the next trade date (or on Sunday when the closure is a Friday).
* Early-halt US holidays (not business days: no settlement, trades count for the next trade
  date): Martin Luther King Jr. Day, Presidents' Day, Memorial Day, Juneteenth (from 2022),
  Independence Day, Labor Day, Thanksgiving Day, with weekend dates observed on the nearest
  weekday (Saturday -> Friday, Sunday -> Monday). Energy halts at 12:00 CT through 2021 and at
  13:30 CT from 2022 on, except Labor Day, which stayed at 12:00 CT. Globex re-opens at 17:00 CT
  the same day (Sunday 17:00 when the holiday is a Friday).
* Early-close business days (settled normally): the day after Thanksgiving, 12:45 CT; Christmas
  Eve when it is Monday to Thursday, 12:45 CT.
* CME's published 2026 schedule breaks the pattern on four days (see PUBLISHED_2026): Juneteenth
  Fri 2026-06-19 12:00, Independence Day observed Fri 2026-07-03 12:00, Labor Day 2026-09-07
  13:30, day after Thanksgiving 2026-11-27 13:45. Years after 2026 are computed by the pattern
  above (as pmc does) and must be checked against CME's schedule when it is published; a new
  table gets a new VERSION. Whether 2026's Friday-holiday 12:00 halt is a new pattern is not
  known (future Friday holidays: 2027-06-18, 2031-07-04, 2032-06-18, 2036-07-04, ...).
* National days of mourning (e.g. 2025-01-09) are not in the table: CME Globex energy traded
  regular hours on 2025-01-09 and no CL expiry depends on that date.

WHERE THE TABLE DISAGREES WITH pandas_market_calendars 5.5.0 (and why)

* Christmas Eve early close. pmc's CMEGlobex_Energy has a 12:45 CT Christmas Eve close only for
  2026 (a one-off date added for the 2026 schedule); for other years it shows a full 16:00 session.
  CME has closed energy early on Christmas Eve at 12:45 CT (13:45 ET) every year it fell Monday to
  Thursday (CME's holiday schedules; QuantConnect LEAN's NYMEX market-hours data lists 13:45 ET
  closes on every such Dec 24 through 2019; pmc issue #464 reports the missing rule). The table
  keeps the 12:45 CT close every year; the affected vectors follow the table and say so.
* 2025-01-09 (National Day of Mourning for President Carter). pmc's CME_TradeDate marks it a
  non-trade date (its source says "FIXME: This is unverified"), while pmc's own CMEGlobex_Energy
  shows a regular session. The table treats it as a regular business day. It does not change
  any CL last trade date (no 25th is near it).
"""

import argparse
import bisect
import datetime as dt
import json
import random
import sys
import warnings
from pathlib import Path
from zoneinfo import ZoneInfo

VERSION = "cme-2026.1"
FIRST_YEAR, LAST_YEAR = 2019, 2038
CT = ZoneInfo("America/Chicago")
UTC = dt.timezone.utc
DAILY_OPEN, DAILY_CLOSE = dt.time(17, 0), dt.time(16, 0)
EXPIRY_CUTOFF = dt.time(13, 30)  # the expiring CL contract stops trading at 13:30 CT

ROOT = Path(__file__).resolve().parent.parent
CALENDAR_PATH = ROOT / "shared" / "data" / "cme_calendar.json"
VECTORS_PATH = ROOT / "shared" / "data" / "cl_vectors.json"

MON, TUE, WED, THU, FRI, SAT, SUN = range(7)
MONTH_CODES = "FGHJKMNQUVXZ"

# Early closes in CME's published 2026 schedule that do not follow the recurring pattern
# (the same dates pmc 5.5.0 carries as one-off closes, from pmc PR #469 / issue #464).
PUBLISHED_2026 = {
    dt.date(2026, 6, 19): "12:00",
    dt.date(2026, 7, 3): "12:00",
    dt.date(2026, 9, 7): "13:30",
    dt.date(2026, 11, 27): "13:45",
}

NOTES = [
    "Business day (for the CL last-trade-day rule and business-day counting) = a Monday to "
    "Friday that is not listed here with business_day false. Days listed with business_day "
    "true are regular trade dates with a shortened Globex session.",
    "session closed: no Globex session for that trade date; Globex re-opens at 17:00 CT on the "
    "closed day for the next trade date (Sunday 17:00 when the day is a Friday).",
    "session early_close: the Globex session for that date halts at close_ct instead of 16:00 "
    "CT; it re-opens at 17:00 CT the same day (Sunday 17:00 when the day is a Friday).",
    "Years after 2026 are computed from the recurring pattern and must be checked against "
    "CME's holiday calendar when CME publishes it; a changed table gets a new version.",
    "Uncertain for later years: CME's 2026 schedule halted energy at 12:00 CT on the two "
    "Friday holidays (Juneteenth, Independence Day observed), at 13:30 CT on Labor Day and at "
    "13:45 CT on the day after Thanksgiving. Whether that becomes the pattern is not known; "
    "later years keep the earlier pattern (13:30, 12:00 and 12:45 CT), as pmc does.",
    "Disagreement with pandas_market_calendars 5.5.0 (CMEGlobex_Energy): Christmas Eve "
    "early close at 12:45 CT when Dec 24 is Monday to Thursday. pmc has it only for 2026 and "
    "shows a full session on {dates}. The table keeps 12:45 CT every year, as CME has "
    "published it (pmc issue #464 reports the missing rule).",
    "Disagreement with pandas_market_calendars 5.5.0 (CME_TradeDate): 2025-01-09 (National Day "
    "of Mourning) is a business day here; pmc marks it a non-trade date, flagged unverified in "
    "its source, while its CMEGlobex_Energy calendar shows a regular session. No CL last trade "
    "date depends on it.",
    "National days of mourning and other ad hoc closures are not modelled.",
]

SOURCES = [
    "CME Group holiday calendar and trading-hours pages for CME Globex energy (CL)",
    "NYMEX rulebook chapter 200 (Light Sweet Crude Oil futures): termination of trading",
    "pandas_market_calendars 5.5.0, calendars CMEGlobex_Energy and CME_TradeDate (cross-check)",
]


# --------------------------------------------------------------------------- the rules


def nth_weekday(year, month, weekday, n):
    d = dt.date(year, month, 1)
    d += dt.timedelta(days=(weekday - d.weekday()) % 7)
    return d + dt.timedelta(weeks=n - 1)


def last_weekday(year, month, weekday):
    d = dt.date(year + (month == 12), month % 12 + 1, 1) - dt.timedelta(days=1)
    return d - dt.timedelta(days=(d.weekday() - weekday) % 7)


def easter(year):
    """Gregorian Easter Sunday (anonymous Gregorian algorithm)."""
    a, b, c = year % 19, year // 100, year % 100
    d, e = b // 4, b % 4
    f = (b + 8) // 25
    g = (b - f + 1) // 3
    h = (19 * a + b - d - g + 15) % 30
    i, k = c // 4, c % 4
    l = (32 + 2 * e + 2 * i - h - k) % 7
    m = (a + 11 * h + 22 * l) // 451
    month = (h + l - 7 * m + 114) // 31
    day = (h + l - 7 * m + 114) % 31 + 1
    return dt.date(year, month, day)


def nearest_weekday(d):
    """US federal observance: Saturday -> Friday, Sunday -> Monday."""
    if d.weekday() == SAT:
        return d - dt.timedelta(days=1)
    if d.weekday() == SUN:
        return d + dt.timedelta(days=1)
    return d


def table_for_year(y):
    """The special days of year y: {date: (name, business_day, close_ct or None for closed)}."""
    days = {}

    def add(d, name, business_day, close):
        assert d.weekday() < SAT, (d, name)
        assert d not in days, (d, name, days.get(d))
        days[d] = (name, business_day, close)

    def observed(d, name):
        o = nearest_weekday(d)
        return o, (name if o == d else f"{name}, observed")

    holiday_close = "12:00" if y <= 2021 else "13:30"

    ny = dt.date(y, 1, 1)
    if ny.weekday() == SUN:
        add(ny + dt.timedelta(days=1), "New Year's Day, observed", False, None)
    elif ny.weekday() != SAT:  # a Saturday New Year's Day is not observed
        add(ny, "New Year's Day", False, None)
    add(nth_weekday(y, 1, MON, 3), "Martin Luther King Jr. Day", False, holiday_close)
    add(nth_weekday(y, 2, MON, 3), "Presidents' Day", False, holiday_close)
    add(easter(y) - dt.timedelta(days=2), "Good Friday", False, None)
    add(last_weekday(y, 5, MON), "Memorial Day", False, holiday_close)
    if y >= 2022:
        add(*observed(dt.date(y, 6, 19), "Juneteenth"), False, "13:30")
    add(*observed(dt.date(y, 7, 4), "Independence Day"), False, holiday_close)
    add(nth_weekday(y, 9, MON, 1), "Labor Day", False, "12:00")
    thanksgiving = nth_weekday(y, 11, THU, 4)
    add(thanksgiving, "Thanksgiving Day", False, holiday_close)
    add(thanksgiving + dt.timedelta(days=1), "the day after Thanksgiving", True, "12:45")
    eve = dt.date(y, 12, 24)
    if eve.weekday() <= THU:  # a Friday Dec 24 is the observed Christmas Day
        add(eve, "Christmas Eve", True, "12:45")
    add(*observed(dt.date(y, 12, 25), "Christmas Day"), False, None)

    for d, close in PUBLISHED_2026.items():
        if d.year == y:
            name, business_day, _ = days[d]
            days[d] = (name, business_day, close)
    return days


def build_table():
    days = {}
    for y in range(FIRST_YEAR, LAST_YEAR + 1):
        days.update(table_for_year(y))
    return dict(sorted(days.items()))


def hhmm(s):
    h, m = s.split(":")
    return dt.time(int(h), int(m))


def table_sessions(days):
    """Globex sessions by trade date per the table: {date: (open_utc, close_utc)}."""
    out = {}
    d = dt.date(FIRST_YEAR, 1, 1)
    while d.year <= LAST_YEAR:
        special = days.get(d)
        if d.weekday() < SAT and not (special and special[2] is None):
            close = hhmm(special[2]) if special else DAILY_CLOSE
            out[d] = (ct_to_utc(d - dt.timedelta(days=1), DAILY_OPEN), ct_to_utc(d, close))
        d += dt.timedelta(days=1)
    return out


def table_business_days(days):
    out = set()
    d = dt.date(FIRST_YEAR, 1, 1)
    while d.year <= LAST_YEAR:
        if d.weekday() < SAT and not (d in days and not days[d][1]):
            out.add(d)
        d += dt.timedelta(days=1)
    return out


def ct_to_utc(d, t):
    return dt.datetime.combine(d, t, tzinfo=CT).astimezone(UTC)


def iso(t):
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- pmc


def pmc_data():
    warnings.simplefilter("ignore")
    import pandas_market_calendars as mcal

    start, end = f"{FIRST_YEAR}-01-01", f"{LAST_YEAR}-12-31"
    energy = mcal.get_calendar("CMEGlobex_Energy").schedule(start, end)
    sessions = {}
    for idx, row in energy.iterrows():
        sessions[idx.date()] = (
            row.market_open.to_pydatetime().astimezone(UTC),
            row.market_close.to_pydatetime().astimezone(UTC),
        )
    trade_dates = {
        ts.date() for ts in mcal.get_calendar("CME_TradeDate").valid_days(start, end).tz_localize(None)
    }
    return mcal.__version__, sessions, trade_dates


def christmas_eve_disagreement(d, ours, theirs):
    return (
        d.month == 12 and d.day == 24 and ours is not None and theirs is not None
        and ours[0] == theirs[0]
        and ours[1] == ct_to_utc(d, dt.time(12, 45)) and theirs[1] == ct_to_utc(d, DAILY_CLOSE)
    )


def cross_check(days, pmc_sessions, pmc_trade_dates):
    """Compare the table with pmc. Returns (patched pmc sessions, patched trade dates, notes)."""
    ours = table_sessions(days)
    patched = dict(pmc_sessions)
    session_notes = {}
    problems = []
    for d in sorted(set(ours) | set(pmc_sessions)):
        a, b = ours.get(d), pmc_sessions.get(d)
        if a == b:
            continue
        if christmas_eve_disagreement(d, a, b):
            patched[d] = a
            session_notes[d] = "pmc 5.5.0 shows a full 16:00 CT session on this Christmas Eve; CME closes energy at 12:45 CT"
        else:
            problems.append(f"session {d}: table {a} vs pmc {b}")

    business = table_business_days(days)
    trade_dates = set(pmc_trade_dates)
    for d in sorted(business ^ pmc_trade_dates):
        if d == dt.date(2025, 1, 9) and d in business:
            trade_dates.add(d)
        else:
            problems.append(f"business day {d}: table {d in business} vs pmc CME_TradeDate {d in pmc_trade_dates}")
    if problems:
        sys.exit("table and pandas_market_calendars disagree beyond the documented cases:\n  " + "\n  ".join(problems))
    return patched, trade_dates, session_notes


# --------------------------------------------------------------------------- vectors


def last_trade_date(year, month, business_days):
    """NYMEX CL: 3 business days before the 25th of the month before the contract month;
    4 business days before it when the 25th is not a business day."""
    y, m = (year - 1, 12) if month == 1 else (year, month - 1)
    the_25th = dt.date(y, m, 25)
    n = 3 if the_25th in business_days else 4
    d = the_25th
    while n:
        d -= dt.timedelta(days=1)
        if d in business_days:
            n -= 1
    return the_25th, d


def ltd_vectors(business_days):
    out = []
    for year in range(2020, LAST_YEAR + 1):
        for month in range(1, 13):
            the_25th, ltd = last_trade_date(year, month, business_days)
            symbol = f"CL{MONTH_CODES[month - 1]}{year % 100:02d}"
            v = {
                "symbol": symbol,
                "last_trade_date": ltd.isoformat(),
                "trading_stops_at": iso(ct_to_utc(ltd, EXPIRY_CUTOFF)),
                "the_25th": the_25th.isoformat(),
                "the_25th_is_business_day": the_25th in business_days,
            }
            out.append(v)
    # Anchors from the design doc, and CLK20 (the April 2020 negative-price contract).
    anchors = {"CLZ26": "2026-11-20", "CLF27": "2026-12-21", "CLK20": "2020-04-21"}
    for v in out:
        if v["symbol"] in anchors:
            assert v["last_trade_date"] == anchors.pop(v["symbol"]), v
    assert not anchors, anchors
    return out


def market_vectors(sessions, pmc_sessions, session_notes):
    """Open/closed at chosen UTC instants from the sessions. "next" is when the state next
    changes: the close (closes_at) when open, the re-open (reopens_at) when closed."""

    def state_fn(by_date):
        spans = sorted(by_date.values())
        opens = [o for o, _ in spans]

        def state(t):
            i = bisect.bisect_right(opens, t) - 1
            if i >= 0 and spans[i][0] <= t < spans[i][1]:
                return {"open": True, "next": iso(spans[i][1])}
            if i + 1 < len(spans):
                return {"open": False, "next": iso(spans[i + 1][0])}
            return None

        return state, spans[0][0], spans[-1][1]

    state, first_ok, last_ok = state_fn(sessions)
    pmc_state, _, _ = state_fn(pmc_sessions)

    instants = set()

    def at_ct(d, hh, mm):
        t = ct_to_utc(d, dt.time(hh, mm))
        if first_ok <= t < last_ok - dt.timedelta(days=7):
            instants.add(t)

    # Around every weekday whose session is not the regular one (holidays, early closes):
    # the evening before, the morning, just before and at the early halt, the daily halt and
    # the 17:00 re-open.
    d = dt.date(FIRST_YEAR, 1, 2)
    while d.year <= LAST_YEAR:
        prev = d - dt.timedelta(days=1)
        regular = sessions.get(d) == (ct_to_utc(prev, DAILY_OPEN), ct_to_utc(d, DAILY_CLOSE))
        if d.weekday() < SAT and not regular:
            for hh, mm in [(15, 59), (16, 0), (17, 0)]:
                at_ct(prev, hh, mm)
            for hh, mm in [(9, 0), (16, 59), (17, 0)]:
                at_ct(d, hh, mm)
            if d in sessions:
                close = sessions[d][1].astimezone(CT)
                for minutes in (-1, 0, 30):
                    t = close + dt.timedelta(minutes=minutes)
                    at_ct(d, t.hour, t.minute)
        d += dt.timedelta(days=1)

    # Both DST switches every year: the switch itself, the weekend edges around it, and the
    # same UTC clock times either side of the switch.
    for y in range(FIRST_YEAR, LAST_YEAR + 1):
        for sunday in (nth_weekday(y, 3, SUN, 2), nth_weekday(y, 11, SUN, 1)):
            friday, monday = sunday - dt.timedelta(days=2), sunday + dt.timedelta(days=1)
            for dd, hh, mm in [(friday, 15, 59), (friday, 16, 0), (sunday, 1, 30), (sunday, 3, 30),
                               (sunday, 16, 59), (sunday, 17, 0), (monday, 15, 59), (monday, 16, 0),
                               (monday, 16, 59), (monday, 17, 0)]:
                at_ct(dd, hh, mm)
            for hours in (21, 22, 23):
                instants.add(dt.datetime.combine(sunday, dt.time(hours, 30), tzinfo=UTC))

    # Weekly and daily edges in the first full week of January, April, July and October.
    for y in range(FIRST_YEAR, LAST_YEAR + 1):
        for m in (1, 4, 7, 10):
            sunday = nth_weekday(y, m, SUN, 1)
            for k, hh, mm in [(0, 16, 59), (0, 17, 0), (2, 15, 59), (2, 16, 0), (2, 16, 30),
                              (2, 17, 0), (5, 15, 59), (5, 16, 0), (6, 12, 0)]:
                at_ct(sunday + dt.timedelta(days=k), hh, mm)

    # Random instants (fixed seed so the file is reproducible).
    rng = random.Random(20261121)
    lo = int(first_ok.timestamp()) + 86400
    hi = int(last_ok.timestamp()) - 8 * 86400
    for _ in range(400):
        instants.add(dt.datetime.fromtimestamp(rng.randrange(lo, hi) // 60 * 60, tz=UTC))

    out = []
    for t in sorted(instants):
        s = state(t)
        if s is None:
            continue
        v = {"at": iso(t), **s}
        if pmc_state(t) != s:
            local_date = t.astimezone(CT).date()
            v["note"] = next(session_notes[d] for d in (local_date, local_date + dt.timedelta(days=1))
                             if d in session_notes)
        out.append(v)
    return out


# --------------------------------------------------------------------------- output


def dump(header, arrays):
    """JSON with one array element per line, so diffs stay readable."""
    lines = ["{"]
    for k, v in header.items():
        lines.append(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)},")
    arr_items = list(arrays.items())
    for j, (k, arr) in enumerate(arr_items):
        lines.append(f"  {json.dumps(k)}: [")
        for i, el in enumerate(arr):
            comma = "," if i + 1 < len(arr) else ""
            lines.append("    " + json.dumps(el, ensure_ascii=False) + comma)
        lines.append("  ]" + ("," if j + 1 < len(arr_items) else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file would change")
    args = ap.parse_args()

    days = build_table()
    pmc_version, pmc_sessions, pmc_trade_dates = pmc_data()
    sessions, trade_dates, session_notes = cross_check(days, pmc_sessions, pmc_trade_dates)

    eve_dates = ", ".join(d.isoformat() for d in sorted(session_notes))
    notes = [n.replace("{dates}", eve_dates) for n in NOTES]

    calendar = dump(
        {
            "version": VERSION,
            "description": "CME Globex energy (NYMEX CL) exchange calendar: holidays, full closures "
                           "and early closes, America/Chicago local times.",
            "timezone": "America/Chicago",
            "first_year": FIRST_YEAR,
            "last_year": LAST_YEAR,
            "daily_open_ct": DAILY_OPEN.strftime("%H:%M"),
            "daily_close_ct": DAILY_CLOSE.strftime("%H:%M"),
            "generated_by": "tools/gen_cl_vectors.py",
            "sources": SOURCES,
            "notes": notes,
        },
        {
            "days": [
                {"date": d.isoformat(), "name": name, "business_day": business_day,
                 "session": "closed" if close is None else "early_close",
                 **({} if close is None else {"close_ct": close})}
                for d, (name, business_day, close) in days.items()
            ]
        },
    )
    vectors = dump(
        {
            "calendar_version": VERSION,
            "generated_by": "tools/gen_cl_vectors.py",
            "source": f"pandas_market_calendars {pmc_version}: CMEGlobex_Energy sessions and CME_TradeDate "
                      "business days; vectors with a 'note' follow the table where it deliberately differs",
            "notes": [n for n in notes if n.startswith("Disagreement")],
        },
        {
            "last_trade_dates": ltd_vectors(trade_dates),
            "market_states": market_vectors(sessions, pmc_sessions, session_notes),
        },
    )

    changed = False
    for path, text in [(CALENDAR_PATH, calendar), (VECTORS_PATH, vectors)]:
        old = path.read_text() if path.exists() else None
        if old != text:
            changed = True
            if args.check:
                print(f"{path.relative_to(ROOT)} would change")
            else:
                path.write_text(text)
                print(f"wrote {path.relative_to(ROOT)}")
        else:
            print(f"{path.relative_to(ROOT)} unchanged")
    if args.check and changed:
        sys.exit(1)


if __name__ == "__main__":
    main()
