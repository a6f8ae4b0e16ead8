"""The coordinator's Ray side: it carries the decisions' commands out as actor calls and reports how
each ended."""
