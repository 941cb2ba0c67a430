from django.contrib import admin

from tests.testapp.models import Profile

admin.site.register(Profile)
