"""Credit notes, payments, refunds, credit grants and their draws (issue 33 items 1, 2), immutable once written;
dunning terms and cases (item 7); tax profiles and rates, and the ``tax`` invoice line kind (item 3).

Triggers, as for finalized invoices (0003): whatever code tries,
- a credit note, its lines, a payment, a refund and a draw cannot be deleted or changed (a credit note's Stripe
  bookkeeping and a grant's expiry notice excepted; a grant's amount, currency and dates never change);
- a credit note is issued only against a finalized or paid invoice, in its currency, and all of an invoice's
  notes together never exceed its total; a note's amount is the sum of its lines (checked at commit); a line
  credits a line of the same invoice, never more than that line's amount over all notes;
- a payment is against a non-draft invoice in its currency; refunds of a payment never exceed it;
- a draw takes from a grant of the invoice's tenant and currency, never beyond the grant.
Each check locks the row it sums against (the invoice, the payment, the grant) so two writers cannot both pass.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


SQL = r"""
CREATE FUNCTION billing_row_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% rows cannot be changed or deleted once written', TG_TABLE_NAME
      USING ERRCODE = 'check_violation', CONSTRAINT = TG_TABLE_NAME || '_immutable';
END $$;

CREATE FUNCTION billing_creditnote_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    inv record;
    credited bigint;
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'credit note % cannot be deleted', OLD.number
          USING ERRCODE = 'check_violation', CONSTRAINT = 'creditnote_immutable';
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF (NEW.id, NEW.tenant_id, NEW.invoice_id, NEW.number, NEW.currency, NEW.reason, NEW.memo,
            NEW.voids_invoice, NEW.amount_minor, NEW.issued_at, NEW.issued_by_id)
           IS DISTINCT FROM
           (OLD.id, OLD.tenant_id, OLD.invoice_id, OLD.number, OLD.currency, OLD.reason, OLD.memo,
            OLD.voids_invoice, OLD.amount_minor, OLD.issued_at, OLD.issued_by_id) THEN
            RAISE EXCEPTION 'credit note % is issued, it cannot change', OLD.number
              USING ERRCODE = 'check_violation', CONSTRAINT = 'creditnote_immutable';
        END IF;
        RETURN NEW;
    END IF;
    SELECT id, tenant_id, currency, status, total_minor INTO inv FROM billing_invoice
     WHERE id = NEW.invoice_id FOR UPDATE;
    IF inv.status NOT IN ('finalized', 'paid') THEN
        RAISE EXCEPTION 'invoice % is %, only a finalized or paid invoice takes a credit note', inv.id, inv.status
          USING ERRCODE = 'check_violation', CONSTRAINT = 'creditnote_invoice_final';
    END IF;
    IF NEW.tenant_id <> inv.tenant_id OR NEW.currency <> inv.currency THEN
        RAISE EXCEPTION 'a credit note has its invoice''s tenant and currency'
          USING ERRCODE = 'check_violation', CONSTRAINT = 'creditnote_matches_invoice';
    END IF;
    SELECT COALESCE(SUM(amount_minor), 0) INTO credited FROM billing_creditnote WHERE invoice_id = NEW.invoice_id;
    IF credited + NEW.amount_minor > inv.total_minor THEN
        RAISE EXCEPTION 'credit notes of invoice % would exceed its total (% + % > %)', inv.id, credited,
            NEW.amount_minor, inv.total_minor
          USING ERRCODE = 'check_violation', CONSTRAINT = 'creditnote_within_total';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER creditnote_guard BEFORE INSERT OR UPDATE OR DELETE ON billing_creditnote
    FOR EACH ROW EXECUTE FUNCTION billing_creditnote_guard();

CREATE FUNCTION billing_creditnote_adds_up() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    lines bigint;
BEGIN
    SELECT COALESCE(SUM(amount_minor), 0) INTO lines FROM billing_creditnoteline WHERE credit_note_id = NEW.id;
    IF lines <> NEW.amount_minor THEN
        RAISE EXCEPTION 'credit note % amounts to % but its lines to %', NEW.number, NEW.amount_minor, lines
          USING ERRCODE = 'check_violation', CONSTRAINT = 'creditnote_lines_add_up';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER creditnote_adds_up AFTER INSERT ON billing_creditnote
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION billing_creditnote_adds_up();

CREATE FUNCTION billing_creditnoteline_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    line record;
    credited bigint;
BEGIN
    IF NEW.invoice_line_id IS NULL THEN
        RETURN NEW;
    END IF;
    SELECT l.id, l.invoice_id, l.amount_minor INTO line FROM billing_invoiceline l WHERE l.id = NEW.invoice_line_id;
    IF line.invoice_id <> (SELECT invoice_id FROM billing_creditnote WHERE id = NEW.credit_note_id) THEN
        RAISE EXCEPTION 'a credit note line credits a line of its own invoice'
          USING ERRCODE = 'check_violation', CONSTRAINT = 'creditnoteline_same_invoice';
    END IF;
    SELECT COALESCE(SUM(amount_minor), 0) INTO credited FROM billing_creditnoteline
     WHERE invoice_line_id = NEW.invoice_line_id;
    IF credited + NEW.amount_minor > line.amount_minor THEN
        RAISE EXCEPTION 'credits of invoice line % would exceed it (% + % > %)', line.id, credited,
            NEW.amount_minor, line.amount_minor
          USING ERRCODE = 'check_violation', CONSTRAINT = 'creditnoteline_within_line';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER creditnoteline_guard BEFORE INSERT ON billing_creditnoteline
    FOR EACH ROW EXECUTE FUNCTION billing_creditnoteline_guard();

CREATE FUNCTION billing_payment_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    inv record;
BEGIN
    SELECT tenant_id, currency, status INTO inv FROM billing_invoice WHERE id = NEW.invoice_id;
    IF inv.status = 'draft' OR NEW.tenant_id <> inv.tenant_id OR NEW.currency <> inv.currency THEN
        RAISE EXCEPTION 'a payment is against a non-draft invoice, in its tenant and currency'
          USING ERRCODE = 'check_violation', CONSTRAINT = 'payment_matches_invoice';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER payment_guard BEFORE INSERT ON billing_payment
    FOR EACH ROW EXECUTE FUNCTION billing_payment_guard();

CREATE FUNCTION billing_refund_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    pay record;
    refunded bigint;
BEGIN
    SELECT id, tenant_id, amount_minor INTO pay FROM billing_payment WHERE id = NEW.payment_id FOR UPDATE;
    SELECT COALESCE(SUM(amount_minor), 0) INTO refunded FROM billing_refund WHERE payment_id = NEW.payment_id;
    IF NEW.tenant_id <> pay.tenant_id OR refunded + NEW.amount_minor > pay.amount_minor THEN
        RAISE EXCEPTION 'refunds of payment % would exceed it (% + % > %)', pay.id, refunded, NEW.amount_minor,
            pay.amount_minor
          USING ERRCODE = 'check_violation', CONSTRAINT = 'refund_within_payment';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refund_guard BEFORE INSERT ON billing_refund
    FOR EACH ROW EXECUTE FUNCTION billing_refund_guard();

CREATE FUNCTION billing_creditgrant_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR (NEW.id, NEW.tenant_id, NEW.currency, NEW.amount_minor, NEW.priority, NEW.expires_at,
                            NEW.granted_at, NEW.reason, NEW.granted_by_id)
                           IS DISTINCT FROM
                           (OLD.id, OLD.tenant_id, OLD.currency, OLD.amount_minor, OLD.priority, OLD.expires_at,
                            OLD.granted_at, OLD.reason, OLD.granted_by_id) THEN
        RAISE EXCEPTION 'credit grant % cannot change once granted', OLD.id
          USING ERRCODE = 'check_violation', CONSTRAINT = 'creditgrant_immutable';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER creditgrant_guard BEFORE UPDATE OR DELETE ON billing_creditgrant
    FOR EACH ROW EXECUTE FUNCTION billing_creditgrant_guard();

CREATE FUNCTION billing_creditdraw_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    g record;
    drawn bigint;
BEGIN
    SELECT id, tenant_id, currency, amount_minor INTO g FROM billing_creditgrant WHERE id = NEW.grant_id FOR UPDATE;
    IF NOT EXISTS (SELECT 1 FROM billing_invoice WHERE id = NEW.invoice_id AND tenant_id = g.tenant_id
                   AND currency = g.currency) THEN
        RAISE EXCEPTION 'a draw is by an invoice of the grant''s tenant and currency'
          USING ERRCODE = 'check_violation', CONSTRAINT = 'creditdraw_matches_grant';
    END IF;
    SELECT COALESCE(SUM(amount_minor), 0) INTO drawn FROM billing_creditdraw WHERE grant_id = NEW.grant_id;
    IF drawn + NEW.amount_minor > g.amount_minor THEN
        RAISE EXCEPTION 'draws on grant % would exceed it (% + % > %)', g.id, drawn, NEW.amount_minor, g.amount_minor
          USING ERRCODE = 'check_violation', CONSTRAINT = 'creditdraw_within_grant';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER creditdraw_guard BEFORE INSERT ON billing_creditdraw
    FOR EACH ROW EXECUTE FUNCTION billing_creditdraw_guard();

CREATE TRIGGER creditnoteline_immutable BEFORE UPDATE OR DELETE ON billing_creditnoteline
    FOR EACH ROW EXECUTE FUNCTION billing_row_immutable();
CREATE TRIGGER payment_immutable BEFORE UPDATE OR DELETE ON billing_payment
    FOR EACH ROW EXECUTE FUNCTION billing_row_immutable();
CREATE TRIGGER refund_immutable BEFORE UPDATE OR DELETE ON billing_refund
    FOR EACH ROW EXECUTE FUNCTION billing_row_immutable();
CREATE TRIGGER creditdraw_immutable BEFORE UPDATE OR DELETE ON billing_creditdraw
    FOR EACH ROW EXECUTE FUNCTION billing_row_immutable();
"""

REVERSE = """
DROP TRIGGER IF EXISTS creditdraw_immutable ON billing_creditdraw;
DROP TRIGGER IF EXISTS refund_immutable ON billing_refund;
DROP TRIGGER IF EXISTS payment_immutable ON billing_payment;
DROP TRIGGER IF EXISTS creditnoteline_immutable ON billing_creditnoteline;
DROP TRIGGER IF EXISTS creditdraw_guard ON billing_creditdraw;
DROP FUNCTION IF EXISTS billing_creditdraw_guard();
DROP TRIGGER IF EXISTS creditgrant_guard ON billing_creditgrant;
DROP FUNCTION IF EXISTS billing_creditgrant_guard();
DROP TRIGGER IF EXISTS refund_guard ON billing_refund;
DROP FUNCTION IF EXISTS billing_refund_guard();
DROP TRIGGER IF EXISTS payment_guard ON billing_payment;
DROP FUNCTION IF EXISTS billing_payment_guard();
DROP TRIGGER IF EXISTS creditnoteline_guard ON billing_creditnoteline;
DROP FUNCTION IF EXISTS billing_creditnoteline_guard();
DROP TRIGGER IF EXISTS creditnote_adds_up ON billing_creditnote;
DROP FUNCTION IF EXISTS billing_creditnote_adds_up();
DROP TRIGGER IF EXISTS creditnote_guard ON billing_creditnote;
DROP FUNCTION IF EXISTS billing_creditnote_guard();
DROP FUNCTION IF EXISTS billing_row_immutable();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0007_usage_primary_key_lease_hour'),
        ('tenants', '0005_wave9_project_status_db_default'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='CreditGrant',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('currency', models.CharField(max_length=3)),
                ('amount_minor', models.BigIntegerField()),
                ('priority', models.PositiveSmallIntegerField(default=0, help_text='Lower draws first.')),
                ('expires_at', models.DateTimeField(blank=True, null=True)),
                ('granted_at', models.DateTimeField()),
                ('reason', models.CharField(max_length=300)),
                ('expiry_notified_at', models.DateTimeField(blank=True, null=True)),
                ('granted_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='credit_grants', to='tenants.tenant')),
            ],
            options={
                'ordering': ['tenant_id', 'priority', 'expires_at', 'pk'],
            },
        ),
        migrations.CreateModel(
            name='CreditDraw',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('amount_minor', models.BigIntegerField()),
                ('drawn_at', models.DateTimeField()),
                ('invoice', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='credit_draws', to='billing.invoice')),
                ('grant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='draws', to='billing.creditgrant')),
            ],
            options={
                'ordering': ['invoice_id', 'pk'],
            },
        ),
        migrations.CreateModel(
            name='CreditNote',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('number', models.CharField(max_length=40, unique=True)),
                ('currency', models.CharField(max_length=3)),
                ('reason', models.CharField(choices=[('duplicate', 'Duplicate charge'), ('fraudulent', 'Fraudulent charge'), ('order_change', 'Order change (a void, a corrected price)'), ('product_unsatisfactory', 'Service unsatisfactory')], max_length=24)),
                ('memo', models.CharField(max_length=500)),
                ('voids_invoice', models.BooleanField(default=False, help_text='Issued by a local void of the invoice.')),
                ('amount_minor', models.BigIntegerField()),
                ('issued_at', models.DateTimeField()),
                ('stripe_credit_note_id', models.CharField(blank=True, max_length=64)),
                ('stripe_state', models.CharField(blank=True, choices=[('', 'Not sent'), ('sending', 'Sending'), ('sent', 'Sent'), ('failed', 'Failed (will retry)')], default='', max_length=8)),
                ('stripe_error', models.TextField(blank=True)),
                ('invoice', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='credit_notes', to='billing.invoice')),
                ('issued_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='credit_notes', to='tenants.tenant')),
            ],
            options={
                'ordering': ['-issued_at', '-pk'],
            },
        ),
        migrations.CreateModel(
            name='CreditNoteLine',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('description', models.CharField(max_length=300)),
                ('amount_minor', models.BigIntegerField()),
                ('credit_note', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='lines', to='billing.creditnote')),
                ('invoice_line', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='billing.invoiceline')),
            ],
            options={
                'ordering': ['credit_note_id', 'pk'],
            },
        ),
        migrations.CreateModel(
            name='Payment',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('currency', models.CharField(max_length=3)),
                ('amount_minor', models.BigIntegerField()),
                ('received_at', models.DateTimeField()),
                ('reference', models.CharField(blank=True, help_text='Stripe charge/invoice id, bank reference.', max_length=100)),
                ('invoice', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='payments', to='billing.invoice')),
                ('recorded_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='payments', to='tenants.tenant')),
            ],
            options={
                'ordering': ['-received_at', '-pk'],
            },
        ),
        migrations.CreateModel(
            name='Refund',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('amount_minor', models.BigIntegerField()),
                ('reason', models.CharField(max_length=300)),
                ('refunded_at', models.DateTimeField()),
                ('reference', models.CharField(blank=True, max_length=100)),
                ('payment', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='refunds', to='billing.payment')),
                ('recorded_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='refunds', to='tenants.tenant')),
            ],
            options={
                'ordering': ['-refunded_at', '-pk'],
            },
        ),
        migrations.AddConstraint(
            model_name='creditgrant',
            constraint=models.CheckConstraint(condition=models.Q(('amount_minor__gt', 0)), name='creditgrant_amount_positive'),
        ),
        migrations.AddConstraint(
            model_name='creditgrant',
            constraint=models.CheckConstraint(condition=models.Q(('expires_at__isnull', True), ('expires_at__gt', models.F('granted_at')), _connector='OR'), name='creditgrant_expires_after_grant'),
        ),
        migrations.AddConstraint(
            model_name='creditdraw',
            constraint=models.UniqueConstraint(fields=('grant', 'invoice'), name='creditdraw_once_per_grant_invoice'),
        ),
        migrations.AddConstraint(
            model_name='creditdraw',
            constraint=models.CheckConstraint(condition=models.Q(('amount_minor__gt', 0)), name='creditdraw_amount_positive'),
        ),
        migrations.AddConstraint(
            model_name='creditnote',
            constraint=models.CheckConstraint(condition=models.Q(('amount_minor__gt', 0)), name='creditnote_amount_positive'),
        ),
        migrations.AddConstraint(
            model_name='creditnote',
            constraint=models.CheckConstraint(condition=models.Q(('reason__in', ['duplicate', 'fraudulent', 'order_change', 'product_unsatisfactory'])), name='creditnote_reason_valid'),
        ),
        migrations.AddConstraint(
            model_name='creditnoteline',
            constraint=models.CheckConstraint(condition=models.Q(('amount_minor__gt', 0)), name='creditnoteline_amount_positive'),
        ),
        migrations.AddConstraint(
            model_name='payment',
            constraint=models.CheckConstraint(condition=models.Q(('amount_minor__gt', 0)), name='payment_amount_positive'),
        ),
        migrations.AddConstraint(
            model_name='refund',
            constraint=models.CheckConstraint(condition=models.Q(('amount_minor__gt', 0)), name='refund_amount_positive'),
        ),

        migrations.CreateModel(
            name='DunningTerms',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('reminder_days', models.JSONField(default=list, help_text='Days after the failed payment, e.g. [1, 3, 7].')),
                ('grace_days', models.PositiveIntegerField(default=14)),
                ('stop_running_leases', models.BooleanField(default=False)),
                ('tenant', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='dunning_terms', to='tenants.tenant')),
            ],
        ),
        migrations.CreateModel(
            name='DunningCase',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('state', models.CharField(choices=[('open', 'Reminding'), ('restricted', 'Restricted (new requests refused)'), ('resolved', 'Resolved')], default='open', max_length=12)),
                ('started_at', models.DateTimeField()),
                ('reminder_days', models.JSONField(default=list)),
                ('reminders_sent', models.PositiveIntegerField(default=0)),
                ('next_reminder_at', models.DateTimeField(blank=True, null=True)),
                ('grace_ends_at', models.DateTimeField()),
                ('stop_running_leases', models.BooleanField(default=False)),
                ('restricted_at', models.DateTimeField(blank=True, null=True)),
                ('resolved_at', models.DateTimeField(blank=True, null=True)),
                ('invoice', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='dunning', to='billing.invoice')),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='dunning_cases', to='tenants.tenant')),
            ],
            options={
                'ordering': ['-started_at'],
                'indexes': [models.Index(fields=['tenant', 'state'], name='billing_dun_tenant__e96889_idx')],
                'constraints': [models.CheckConstraint(condition=models.Q(('state__in', ['open', 'restricted', 'resolved'])), name='dunningcase_state_valid'), models.CheckConstraint(condition=models.Q(models.Q(('state', 'restricted'), _negated=True), ('restricted_at__isnull', False), _connector='OR'), name='dunningcase_restricted_has_time')],
            },
        ),

        migrations.CreateModel(
            name='TaxProfile',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('tax_id', models.CharField(blank=True, max_length=40)),
                ('reverse_charge', models.BooleanField(default=False)),
                ('legal_note', models.CharField(blank=True, max_length=300)),
            ],
        ),
        migrations.CreateModel(
            name='TaxRate',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('jurisdiction', models.CharField(help_text='e.g. DE, US-CA', max_length=40)),
                ('name', models.CharField(help_text='e.g. VAT, Sales tax', max_length=60)),
                ('percentage', models.DecimalField(decimal_places=4, max_digits=7)),
                ('inclusive', models.BooleanField(default=False)),
                ('active', models.BooleanField(default=True)),
                ('created_at', models.DateTimeField()),
            ],
            options={
                'ordering': ['tenant_id', 'pk'],
            },
        ),
        migrations.RemoveConstraint(
            model_name='invoiceline',
            name='invoiceline_kind_valid',
        ),
        migrations.AlterField(
            model_name='invoiceline',
            name='kind',
            field=models.CharField(choices=[('usage', 'GPU usage'), ('energy', 'Energy pass-through'), ('discount', 'Discount'), ('commit', 'Committed-use minimum'), ('slo_credit', 'SLO credit'), ('correction', 'Correction of an earlier invoice'), ('tax', 'Tax')], max_length=12),
        ),
        migrations.AddConstraint(
            model_name='invoiceline',
            constraint=models.CheckConstraint(condition=models.Q(('kind__in', ['usage', 'energy', 'discount', 'commit', 'slo_credit', 'correction', 'tax'])), name='invoiceline_kind_valid'),
        ),
        migrations.AddField(
            model_name='taxprofile',
            name='tenant',
            field=models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='tax_profile', to='tenants.tenant'),
        ),
        migrations.AddField(
            model_name='taxrate',
            name='tenant',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='tax_rates', to='tenants.tenant'),
        ),
        migrations.AddConstraint(
            model_name='taxprofile',
            constraint=models.CheckConstraint(condition=models.Q(('reverse_charge', False), models.Q(('legal_note', ''), _negated=True), _connector='OR'), name='taxprofile_reverse_charge_has_note'),
        ),
        migrations.AddConstraint(
            model_name='taxrate',
            constraint=models.CheckConstraint(condition=models.Q(('percentage__gte', 0), ('percentage__lte', 100)), name='taxrate_percentage_range'),
        ),
        migrations.AddConstraint(
            model_name='taxrate',
            constraint=models.UniqueConstraint(condition=models.Q(('active', True)), fields=('tenant', 'jurisdiction', 'name'), name='taxrate_one_active_per_name'),
        ),
        migrations.RunSQL(SQL, REVERSE),
    ]
