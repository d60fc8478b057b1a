"""Dates and times as the platform shows them (settings.FORMAT_MODULE_PATH): to the second,
year first, in the admin's lists, fields and inlines alike ("2026-12-01 11:22:05" rather than
"Dec. 1, 2026, 11:22 a.m."). Times are UTC (settings.TIME_ZONE)."""

DATE_FORMAT = "Y-m-d"
DATETIME_FORMAT = "Y-m-d H:i:s"
TIME_FORMAT = "H:i:s"
SHORT_DATE_FORMAT = "Y-m-d"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s"
