"""A finalized invoice never changes (docs/architecture.md §7.4), whatever code tries:

1. ``invoice_frozen``: once an invoice is no longer a draft, its tenant, period, currency, number and
   amounts cannot change, and it cannot be deleted; status may only move forward (finalized → paid |
   void; paid → void is refused too) and the payment/Stripe bookkeeping fields stay writable.
2. ``invoiceline_frozen``: lines of a non-draft invoice cannot be inserted, updated or deleted.
"""

from django.db import migrations

SQL = r"""
CREATE FUNCTION billing_invoice_frozen() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.status <> 'draft' THEN
            RAISE EXCEPTION 'invoice % is %, it cannot be deleted', OLD.id, OLD.status
              USING ERRCODE = 'check_violation', CONSTRAINT = 'invoice_frozen';
        END IF;
        RETURN OLD;
    END IF;
    IF OLD.status = 'draft' THEN
        RETURN NEW;
    END IF;
    IF NEW.tenant_id <> OLD.tenant_id OR NEW.period <> OLD.period OR NEW.currency <> OLD.currency
       OR NEW.number IS DISTINCT FROM OLD.number OR NEW.subtotal_minor <> OLD.subtotal_minor
       OR NEW.discount_minor <> OLD.discount_minor OR NEW.credit_minor <> OLD.credit_minor
       OR NEW.total_minor <> OLD.total_minor OR NEW.computed_at <> OLD.computed_at
       OR NEW.finalized_at IS DISTINCT FROM OLD.finalized_at THEN
        RAISE EXCEPTION 'invoice % is %, its amounts cannot change', OLD.id, OLD.status
          USING ERRCODE = 'check_violation', CONSTRAINT = 'invoice_frozen';
    END IF;
    IF NEW.status <> OLD.status AND NOT (
         (OLD.status = 'finalized' AND NEW.status IN ('paid', 'void'))) THEN
        RAISE EXCEPTION 'invoice % cannot go from % to %', OLD.id, OLD.status, NEW.status
          USING ERRCODE = 'check_violation', CONSTRAINT = 'invoice_frozen';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER invoice_frozen BEFORE UPDATE OR DELETE ON billing_invoice
    FOR EACH ROW EXECUTE FUNCTION billing_invoice_frozen();

CREATE FUNCTION billing_invoiceline_frozen() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
BEGIN
    SELECT status INTO v_status FROM billing_invoice
     WHERE id = (CASE WHEN TG_OP = 'DELETE' THEN OLD.invoice_id ELSE NEW.invoice_id END);
    IF v_status IS NOT NULL AND v_status <> 'draft' THEN
        RAISE EXCEPTION 'lines of a % invoice cannot change', v_status
          USING ERRCODE = 'check_violation', CONSTRAINT = 'invoiceline_frozen';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER invoiceline_frozen BEFORE INSERT OR UPDATE OR DELETE ON billing_invoiceline
    FOR EACH ROW EXECUTE FUNCTION billing_invoiceline_frozen();
"""

REVERSE = """
DROP TRIGGER IF EXISTS invoiceline_frozen ON billing_invoiceline;
DROP FUNCTION IF EXISTS billing_invoiceline_frozen();
DROP TRIGGER IF EXISTS invoice_frozen ON billing_invoice;
DROP FUNCTION IF EXISTS billing_invoice_frozen();
"""


class Migration(migrations.Migration):
    dependencies = [("billing", "0002_pricing_invoices")]

    operations = [migrations.RunSQL(SQL, REVERSE)]
