from console.roles import PERMISSIONS, Perm, Role, role_allows


def test_every_permission_is_in_the_table():
    assert set(PERMISSIONS) == set(Perm)


def test_owner_may_do_everything():
    assert all(role_allows(Role.OWNER, perm) for perm in Perm)


def test_viewer_may_only_view():
    allowed = {perm for perm in Perm if role_allows(Role.VIEWER, perm)}
    assert allowed == {Perm.TEAM_VIEW}


def test_annotator_annotates_but_does_not_manage():
    assert role_allows(Role.ANNOTATOR, Perm.ANNOTATE)
    assert not role_allows(Role.ANNOTATOR, Perm.DATASET_WRITE)
    assert not role_allows(Role.ANNOTATOR, Perm.TEAM_MANAGE)


def test_only_owners_manage_members_and_read_the_audit_log():
    for role in Role:
        assert role_allows(role, Perm.TEAM_MANAGE) == (role == Role.OWNER)
        assert role_allows(role, Perm.AUDIT_VIEW) == (role == Role.OWNER)
