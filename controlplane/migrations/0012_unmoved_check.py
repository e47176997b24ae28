from django.db import migrations

# The check of a commit built from a lease holder's copy of its task (see
# controlplane.storage.statements, inline_commit and inline_end): the statement that
# writes the task passes how many rows it wrote; anything but one means the task moved
# since the copy, and the statement is aborted with an error of that name, so that
# nothing lands and the caller builds the commit again from what the database holds.
CREATE = """
CREATE FUNCTION kernel_unmoved(written bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF written <> 1 THEN
        RAISE EXCEPTION 'the task moved since the copy its commit was built from'
            USING ERRCODE = 'KR001';
    END IF;
    RETURN written;
END
$$
"""


class Migration(migrations.Migration):

    dependencies = [
        ("controlplane", "0011_bulk_action"),
    ]

    operations = [
        migrations.RunSQL(CREATE, "DROP FUNCTION kernel_unmoved(bigint)"),
    ]
