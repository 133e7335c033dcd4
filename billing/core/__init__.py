"""Billing's arithmetic, pure Python (no Django, no database): money and rates (``pricing``), the hours a lease
held capacity (``metering``), SLO figures (``slo``) and invoice periods (``periods``). Tested alone; the
architecture test keeps frameworks out."""
