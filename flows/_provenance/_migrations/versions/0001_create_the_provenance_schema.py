"""Create the provenance schema: every table with its keys and constraints.

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = '0001'
down_revision: str | None = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('campaign',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('site', sa.String(), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=False),
    sa.Column('code_version', sa.String(), nullable=False),
    sa.Column('status', sa.String(), nullable=False),
    sa.Column('error_code', sa.String(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("status IN ('running', 'completed', 'blocked', 'escalated', 'awaiting_approval', 'failed')", name='ck_campaign_status'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_table('round',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('campaign_id', sa.Integer(), nullable=False),
    sa.Column('round_index', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(), nullable=False),
    sa.Column('surrogate_state', sa.JSON(), nullable=True),
    sa.Column('policy_state', sa.JSON(), nullable=True),
    sa.Column('planner_state', sa.JSON(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status IN ('running', 'completed', 'blocked', 'escalated', 'awaiting_approval', 'failed')", name='ck_round_status'),
    sa.ForeignKeyConstraint(['campaign_id'], ['campaign.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('campaign_id', 'round_index', name='uq_round_campaign_index')
    )
    op.create_table('approval',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('campaign_id', sa.Integer(), nullable=False),
    sa.Column('round_index', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(), nullable=False),
    sa.Column('rule', sa.String(), nullable=True),
    sa.Column('approvers_allowed', sa.JSON(), nullable=False),
    sa.Column('requested_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('description', sa.Text(), nullable=True),
    sa.Column('flow_run_id', sa.String(), nullable=True),
    sa.Column('decided_by', sa.String(), nullable=True),
    sa.Column('decision', sa.String(), nullable=True),
    sa.Column('comment', sa.Text(), nullable=True),
    sa.Column('overrides', sa.JSON(), nullable=True),
    sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("decision IS NULL OR decision IN ('approved', 'rejected', 'timeout', 'not_allowed')", name='ck_approval_decision'),
    sa.ForeignKeyConstraint(['campaign_id', 'round_index'], ['round.campaign_id', 'round.round_index'], name='fk_approval_round', ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key')
    )
    op.create_table('batch',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(), nullable=False),
    sa.Column('campaign_id', sa.Integer(), nullable=False),
    sa.Column('round_index', sa.Integer(), nullable=False),
    sa.Column('candidates', sa.JSON(), nullable=False),
    sa.Column('backend', sa.String(), nullable=False),
    sa.Column('launched_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('status', sa.String(), nullable=False),
    sa.CheckConstraint("status IN ('launched', 'finished')", name='ck_batch_status'),
    sa.ForeignKeyConstraint(['campaign_id', 'round_index'], ['round.campaign_id', 'round.round_index'], name='fk_batch_round', ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key')
    )
    op.create_table('gate_call',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('campaign_id', sa.Integer(), nullable=False),
    sa.Column('round_index', sa.Integer(), nullable=False),
    sa.Column('call_index', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(), nullable=False),
    sa.Column('budget', sa.Integer(), nullable=False),
    sa.Column('attempts_used', sa.Integer(), nullable=False),
    sa.Column('disposition', sa.String(), nullable=False),
    sa.Column('fallback_hash', sa.String(), nullable=True),
    sa.Column('fallback_value', sa.JSON(), nullable=True),
    sa.Column('fallback_computed_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("disposition IN ('pending', 'accepted', 'fallback', 'not_accepted')", name='ck_gate_call_disposition'),
    sa.ForeignKeyConstraint(['campaign_id', 'round_index'], ['round.campaign_id', 'round.round_index'], name='fk_gate_call_round', ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('campaign_id', 'round_index', 'call_index', name='uq_gate_call')
    )
    op.create_table('policy_decision',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('campaign_id', sa.Integer(), nullable=False),
    sa.Column('round_index', sa.Integer(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('outcome', sa.String(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('code', sa.String(), nullable=True),
    sa.Column('rules_fired', sa.JSON(), nullable=True),
    sa.Column('severities', sa.JSON(), nullable=True),
    sa.Column('explanation', sa.Text(), nullable=True),
    sa.Column('shadow', sa.JSON(), nullable=True),
    sa.Column('state_after', sa.JSON(), nullable=True),
    sa.Column('extra', sa.JSON(), nullable=True),
    sa.Column('recorded_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['campaign_id', 'round_index'], ['round.campaign_id', 'round.round_index'], name='fk_policy_decision_round', ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('campaign_id', 'round_index', 'seq', name='uq_policy_decision')
    )
    op.create_table('approval_event',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('approval_id', sa.Integer(), nullable=False),
    sa.Column('event_key', sa.String(), nullable=True),
    sa.Column('decided_by', sa.String(), nullable=True),
    sa.Column('decision', sa.String(), nullable=False),
    sa.Column('comment', sa.Text(), nullable=True),
    sa.Column('overrides', sa.JSON(), nullable=True),
    sa.Column('allowed', sa.Boolean(), nullable=False),
    sa.Column('settled', sa.Boolean(), nullable=False),
    sa.Column('recorded_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("decision IN ('approved', 'rejected', 'timeout', 'not_allowed')", name='ck_approval_event_decision'),
    sa.ForeignKeyConstraint(['approval_id'], ['approval.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('approval_id', 'event_key', name='uq_approval_event_key')
    )
    op.create_table('attempt',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('gate_call_id', sa.Integer(), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('value', sa.JSON(), nullable=True),
    sa.Column('rejected_by', sa.String(), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('verdicts', sa.JSON(), nullable=False),
    sa.Column('scores', sa.JSON(), nullable=False),
    sa.Column('duration', sa.Float(), nullable=False),
    sa.Column('trace_id', sa.String(), nullable=True),
    sa.Column('span_id', sa.String(), nullable=True),
    sa.ForeignKeyConstraint(['gate_call_id'], ['gate_call.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('gate_call_id', 'number', name='uq_attempt')
    )
    op.create_table('task_result',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('batch_id', sa.Integer(), nullable=False),
    sa.Column('task_index', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(), nullable=False),
    sa.Column('candidate', sa.JSON(), nullable=True),
    sa.Column('status', sa.String(), nullable=False),
    sa.Column('value', sa.JSON(), nullable=True),
    sa.Column('objective', sa.Float(), nullable=True),
    sa.Column('runtime', sa.Float(), nullable=True),
    sa.Column('host', sa.String(), nullable=True),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('stderr_tail', sa.Text(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('error_code', sa.String(), nullable=True),
    sa.Column('retries', sa.JSON(), nullable=True),
    sa.CheckConstraint("status IN ('done', 'failed', 'timeout', 'cancelled')", name='ck_task_result_status'),
    sa.ForeignKeyConstraint(['batch_id'], ['batch.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('batch_id', 'task_index', name='uq_task_result')
    )


def downgrade() -> None:
    op.drop_table('task_result')
    op.drop_table('attempt')
    op.drop_table('approval_event')
    op.drop_table('policy_decision')
    op.drop_table('gate_call')
    op.drop_table('batch')
    op.drop_table('approval')
    op.drop_table('round')
    op.drop_table('campaign')
